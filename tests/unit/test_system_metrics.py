"""Where the training nodes' system metrics go, and that sampling never stops a training."""

from __future__ import annotations

import pytest

from training.loop import system_metrics
from training.loop.system_metrics import MonitoredWorker, SystemMetricsTarget, monitored


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
