"""Where the training nodes' system metrics go, and that sampling never stops a training."""

from __future__ import annotations

import time

import pytest

from training.tracking import system_metrics
from training.tracking.system_metrics import MonitoredWorker, SystemMetricsTarget, monitored


def test_sampling_is_off_at_zero_and_for_a_uri_with_credentials():
    assert SystemMetricsTarget.of("run", "http://127.0.0.1:5000", 0) is None
    assert SystemMetricsTarget.of("run", "https://user:secret@mlflow.example", 10) is None
    target = SystemMetricsTarget.of("run", "sqlite:////home/x/mlflow.db", 2.5)
    assert target == SystemMetricsTarget("run", "sqlite:////home/x/mlflow.db", 2.5)


def test_without_a_target_the_worker_is_the_loop_itself():
    def loop(settings):
        return settings

    assert monitored(loop, None) is loop
    assert isinstance(monitored(loop, SystemMetricsTarget("r", "sqlite:///x", 1)), MonitoredWorker)


class _Monitor:
    finished = 0

    def finish(self):
        _Monitor.finished += 1


@pytest.mark.parametrize("fails", [False, True])
def test_the_monitor_stops_when_the_loop_ends_or_fails(monkeypatch, fails):
    _Monitor.finished = 0
    monkeypatch.setattr(system_metrics, "_start_monitor", lambda target: _Monitor())

    def loop(settings):
        if fails:
            raise RuntimeError("rank crashed")
        return {"history": settings["epochs"]}

    worker = MonitoredWorker(loop, SystemMetricsTarget("r", "sqlite:///x", 1))
    if fails:
        with pytest.raises(RuntimeError, match="rank crashed"):
            worker({"epochs": 2})
    else:
        assert worker({"epochs": 2}) == {"history": 2}
    assert _Monitor.finished == 1


class _FakeMlflowMonitor:
    """Stands in for MLflow's monitor: records what the glue asks of it."""

    built = None  # threading.Event the constructor waits for
    made: list = []

    def __init__(self, run_id, **options):
        self.run_id, self.options, self.calls = run_id, options, []
        _FakeMlflowMonitor.built.wait(5)
        _FakeMlflowMonitor.made.append(self)

    def start(self):
        self.calls.append("start")

    def finish(self):
        self.calls.append("finish")


@pytest.fixture
def fake_mlflow_monitor(monkeypatch):
    import threading

    import mlflow.system_metrics.system_metrics_monitor as mlflow_monitor

    _FakeMlflowMonitor.built, _FakeMlflowMonitor.made = threading.Event(), []
    monkeypatch.setattr(mlflow_monitor, "SystemMetricsMonitor", _FakeMlflowMonitor)
    return _FakeMlflowMonitor


def _wait_until(predicate):
    deadline = time.monotonic() + 5
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_monitor_is_built_beside_training_and_names_its_node(fake_mlflow_monitor):
    target = SystemMetricsTarget("run-1", "sqlite:///x", 2)
    background = system_metrics._BackgroundMonitor(target, node_index=1)
    fake_mlflow_monitor.built.set()
    _wait_until(lambda: background._monitor is not None)
    (made,) = fake_mlflow_monitor.made
    assert made.run_id == "run-1" and made.options["node_id"] == "node_1"
    assert made.options["sampling_interval"] == 2 and made.options["tracking_uri"] == "sqlite:///x"
    background.finish()
    assert made.calls == ["start", "finish"]


def test_the_training_does_not_wait_long_for_a_monitor_stuck_on_a_server_gone(
    fake_mlflow_monitor, monkeypatch, caplog
):
    import threading

    stuck = threading.Event()  # MLflow's retries of the monitor's last get_run
    monkeypatch.setattr(_FakeMlflowMonitor, "finish", lambda self: stuck.wait(30))
    background = system_metrics._BackgroundMonitor(SystemMetricsTarget("r", "sqlite:///x", 1), 0)
    fake_mlflow_monitor.built.set()
    _wait_until(lambda: background._monitor is not None)
    started = time.monotonic()
    background.finish(wait_s=0.3)
    assert time.monotonic() - started < 5
    assert "last samples not logged" in caplog.text
    stuck.set()


def test_a_training_that_ends_before_the_monitor_is_built_starts_none(fake_mlflow_monitor):
    background = system_metrics._BackgroundMonitor(SystemMetricsTarget("r", "sqlite:///x", 1), 0)
    background.finish()  # training over while MLflow still loads
    fake_mlflow_monitor.built.set()
    _wait_until(lambda: fake_mlflow_monitor.made)
    time.sleep(0.2)  # the build thread's moment to start it, were it wrong
    (made,) = fake_mlflow_monitor.made
    assert made.calls == []


def test_the_train_stage_wraps_the_worker_only_with_a_target():
    def loop(settings):
        return settings

    assert system_metrics.sampling(None) is None
    wrap = system_metrics.sampling(SystemMetricsTarget("r", "sqlite:///x", 1))
    wrapped = wrap(loop)
    assert isinstance(wrapped, MonitoredWorker) and wrapped.train_fn is loop
