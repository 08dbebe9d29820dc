"""The MLflow server stopped during the final training and not back within a short
``mlflow.outage_grace_s``: the run exits 1 naming `trainflow run --resume`; with the server
started again (same port, same store) the resume finishes without training again, and the
MLflow runs are continued, not duplicated. Two CLI runs (the sweep off): ~5 min on 2 shared
cores."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cli_runner import TRAINFLOW, cli_env, free_port
from mlflow import MlflowClient
from mlflow_servers import mlflow_server
from smoke_runs import SMOKE

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EPOCHS = 12  # room to stop the server while the training runs (an epoch: about a second)
RUN_ID = "outage"
ARGS = (
    "--config",
    SMOKE,
    "--set",
    "sweep.enabled=false",
    "--set",
    f"train.max_epochs={EPOCHS}",
    "--set",
    "mlflow.outage_grace_s=15",
)


class ServerWhileTraining(threading.Thread):
    """The server, stopped once the run's log (named on the console's first line) shows the
    training's second epoch."""

    def __init__(self, home: Path, port: int, console: Path) -> None:
        super().__init__(daemon=True)
        self.home, self.port, self.console = home, port, console
        self.up, self.stopped = threading.Event(), threading.Event()
        self.give_up = threading.Event()

    def run(self) -> None:
        with mlflow_server(self.home, self.home / "server-1.log", port=self.port):
            self.up.set()
            while not self.give_up.is_set():
                if f"train: epoch 2/{EPOCHS}" in _run_log(self.console):
                    break
                time.sleep(0.2)
        self.stopped.set()


def _check_the_record(client, runs, run_id: str, summary: dict, home: Path) -> None:
    """The outage that stopped the first run: kept beside its checkpoints, written on the
    parent run by the resume, and named by its summary."""
    (parent,) = [r for r in runs if r.info.run_name == f"pipeline-{run_id}"]
    assert parent.data.tags.get("trainflow.outages") == "1"
    table = json.loads(
        Path(client.download_artifacts(parent.info.run_id, "outages.json", str(home))).read_text()
    )
    (row,) = table["data"]
    assert "the train stage, stopped" in row[table["columns"].index("waited")]
    assert [o["waited"] for o in summary["outages"]] == [row[table["columns"].index("waited")]]


def _run_log(console: Path) -> str:
    lines = console.read_text(errors="replace").splitlines() if console.exists() else []
    if not lines or not lines[0].startswith("trainflow run: libraries log to "):
        return ""
    path = Path(lines[0].rsplit(" ", 1)[-1])
    return path.read_text(errors="replace") if path.is_file() else ""


def _trainflow(home: Path, console: Path, *args: str, url: str) -> subprocess.Popen:
    (home / "cwd").mkdir(exist_ok=True)
    with console.open("w") as out:
        return subprocess.Popen(
            [*TRAINFLOW, "run", *args],
            cwd=home / "cwd",
            env=cli_env(home, MLFLOW_TRACKING_URI=url, RAY_USAGE_STATS_ENABLED="0"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_past_the_grace_the_run_stops_and_its_resume_finishes_without_training_again(tmp_path):
    home, port = tmp_path, free_port()
    url = f"http://127.0.0.1:{port}"
    first_console = home / "console-1.txt"
    server = ServerWhileTraining(home, port, first_console)
    server.start()
    assert server.up.wait(120)
    started = time.monotonic()
    first = _trainflow(home, first_console, *ARGS, "--run-id", RUN_ID, url=url)
    try:
        code = first.wait(timeout=600)
    finally:
        server.give_up.set()
    first_s = time.monotonic() - started
    out = " ".join(first_console.read_text(errors="replace").split())
    assert server.stopped.is_set()
    assert code == 1, out[-4000:]
    assert "mlflow.outage_grace_s" in out and f"trainflow run --resume {RUN_ID}" in out, out[-3000:]
    assert "epoch metrics not logged yet" in _run_log(first_console)  # gone while it trained

    second_console = home / "console-2.txt"
    with mlflow_server(home, home / "server-2.log", port=port):
        started = time.monotonic()
        summary_json = home / "summary.json"
        resume = ("--resume", RUN_ID, "--summary-json", str(summary_json))
        second = _trainflow(home, second_console, *ARGS, *resume, url=url)
        code = second.wait(timeout=600)
        second_s = time.monotonic() - started
        out = second_console.read_text(errors="replace")
        assert code == 0, out[-4000:]
        client = MlflowClient(url)
        experiment = client.get_experiment_by_name("trainflow-smoke")
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
        names = sorted(r.info.run_name for r in runs)
        train_runs = [r for r in runs if r.data.tags.get("trainflow.stage") == "train"]
        assert len(train_runs) == 1, names
        assert len([r for r in runs if r.info.run_name == f"pipeline-{RUN_ID}"]) == 1, names
        assert {r.info.status for r in runs} == {"FINISHED"}, names
        history = client.get_metric_history(train_runs[0].info.run_id, "val_accuracy")
        assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1))
        versions = client.search_model_versions("name='digits-smoke'")
        assert len(versions) == 1, [v.version for v in versions]
        assert f"train: epoch 1/{EPOCHS}" not in _run_log(second_console)  # nothing trained again
        _check_the_record(client, runs, RUN_ID, json.loads(summary_json.read_text()), home)
    print(f"first run {first_s:.0f} s (exit 1), resume {second_s:.0f} s")
