"""The Prefect server a run reports to stops during training: the run finishes.

`trainflow run` against a real `prefect server start` (PREFECT_API_URL, as with `trainflow up`);
the server is stopped once the final training reports its first epoch and started again
OUTAGE_S later on the same port and database. The rest of the run (the training's end,
evaluate, promote, the artifacts, the flow's final state) meets a server that does not answer:
Prefect's client waits for it (trainflow sets PREFECT_CLIENT_MAX_RETRIES=7, ~254 s) and its
events client sends the task states it kept once the server is back. Prefect's default 5 retries
(~62 s from the run's first refused call) rode out a 60 s stop, but not this one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import cli_env, free_port
from prefect_servers import PrefectServer

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OUTAGE_S = 90  # from the stop to the next start; the server then takes 10-40 s to answer
EPOCHS = 5  # the outage begins after the first: the whole rest of the run meets it
ARGS = (
    "run",
    "--config",
    str(REPO_ROOT / "configs" / "smoke.yaml"),
    "--set",
    "sweep.enabled=false",
    "--set",
    f"train.max_epochs={EPOCHS}",
)
STAGES = ("inspect-data", "preprocess", "train", "evaluate", "promote")


def _wait_for(condition, proc: subprocess.Popen, out: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"exited ({proc.returncode}):\n" + out.read_text()[-4000:]
        assert time.monotonic() < deadline, "timed out:\n" + out.read_text()[-4000:]
        time.sleep(0.2)


def _final_states(server: PrefectServer, timeout_s: float = 60) -> tuple[list, dict]:
    """(flow runs' state types, task name -> state type), once the server has recorded every
    stage's task run from the events the run sent again."""
    deadline = time.monotonic() + timeout_s
    while True:
        flows = [run["state_type"] for run in server.post("flow_runs/filter")]
        tasks = {
            run["name"].rsplit("-", 1)[0]: run["state_type"]
            for run in server.post("task_runs/filter")
        }
        done = all(tasks.get(stage) == "COMPLETED" for stage in STAGES)
        if done or time.monotonic() > deadline:
            return flows, tasks
        time.sleep(1)


def test_the_prefect_server_stopped_during_training_does_not_fail_the_run(tmp_path):
    started = time.monotonic()
    server = PrefectServer(tmp_path / "prefect-server", free_port())
    server.home.mkdir()
    server.start()
    home = tmp_path / "home"
    (home / "cwd").mkdir(parents=True)
    out = tmp_path / "run.txt"
    env = cli_env(home, PREFECT_API_URL=server.api_url)
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainflow", *ARGS],
            cwd=home / "cwd",
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(lambda: "[3/5] train: epoch" in out.read_text(), proc, out, timeout_s=600)
        server.stop()
        stopped = time.monotonic()
        time.sleep(OUTAGE_S)
        assert proc.poll() is None, "the run ended while the server was down:\n" + out.read_text()
        restart_s = server.start()
        down_s = time.monotonic() - stopped
        code = proc.wait(timeout=600)
        output = out.read_text()
        assert code == 0, output[-4000:]
        print(
            f"\nPrefect server unanswering {down_s:.0f} s (its restart {restart_s:.0f} s); "
            f"test {time.monotonic() - started:.0f} s"
        )
        flows, tasks = _final_states(server)
        assert flows == ["COMPLETED"], flows
        assert all(tasks.get(stage) == "COMPLETED" for stage in STAGES), tasks
        run_log = Path(output.splitlines()[0].rsplit(" ", 1)[-1]).read_text(errors="replace")
        assert "Unable to connect" in run_log  # the run did meet the outage
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
