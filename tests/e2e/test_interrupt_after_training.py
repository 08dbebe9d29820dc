"""Ctrl-C after training: the run stops with exit 130 and the resume command, not exit 0.

The SIGINT comes as the console reports the evaluation done (the train stage long over): the
KeyboardInterrupt its handler raises was dropped there (raised inside a garbage-collector
callback, "Exception ignored"), and the run registered its model and exited 0.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from flow_process import FlowProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
RUN_ID = "late-ctrl-c"
# The lightest whole run: no sweep, one epoch.
ARGS = ("--config", SMOKE, "--set", "sweep.enabled=false", "--set", "train.max_epochs=1")


def test_sigint_after_training_exits_130_with_the_resume_command(tmp_path):
    flow = FlowProcess(tmp_path, *ARGS, "--run-id", RUN_ID)
    try:
        flow.wait_until(lambda: "[4/5] evaluate:" in flow.output())
        flow.proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = flow.wait(timeout=120)
        stop_s = time.monotonic() - sent
        left = flow.wait_session_empty(timeout=30)
    finally:
        flow.kill_session()
    print(f"SIGINT after training: run {flow.wall_s:.1f} s, stopped {stop_s:.1f} s after it")
    out = " ".join(flow.output().split())  # the message may wrap
    assert code == 130, out[-3000:]
    assert "interrupted" in out and f"trainflow run --resume {RUN_ID}" in out, out[-3000:]
    assert left == {}, f"processes of the stopped run still alive: {left}"

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainflow-smoke")
    runs = client.search_runs([experiment.experiment_id])
    statuses = {r.info.run_name: r.info.status for r in runs}
    assert "RUNNING" not in statuses.values(), statuses
    assert statuses[f"pipeline-{RUN_ID}"] == "KILLED", statuses
