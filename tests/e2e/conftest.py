"""The smoke pipeline's runs, made once per test session and shared by the modules that read
them, and the `trainflow up` stack that test_operations.py and test_local_stack.py share
(shared_stack.py).

test_pipeline.py checks the first run (canary credentials, listeners, console, the embedded
MLflow store) and the second (preprocessing cached, the next model version); test_mlflow_ui.py
reads that second run through a real ``mlflow server`` over the same store, in a browser too.
Each smoke run is ~90 s of Ray, Prefect and MLflow on 2 cores: one run fewer for the suite.
Under ``make test`` both modules go to one pytest worker (tests/conftest.py, RUNS_WITH).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import shared_stack
from cli_runner import run_cli, run_cli_watching_listeners
from mlflow_servers import mlflow_server
from smoke_runs import CANARIES, SMOKE, ray_sessions


@pytest.fixture(scope="session")
def smoke_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e-home")


@pytest.fixture(scope="session")
def smoke_watched_run(smoke_home):
    """The first run: canary credentials in its environment, stdout a pipe (not a terminal),
    and the listening sockets of every process it starts sampled while it runs. Returns
    (summary, process, listeners, the Ray sessions in the home when it ended)."""
    out = smoke_home / "summary-1.json"
    proc, listeners = run_cli_watching_listeners(
        smoke_home, "run", "--config", SMOKE, "--summary-json", str(out), **CANARIES
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc, listeners, ray_sessions(smoke_home)


@pytest.fixture(scope="session")
def smoke_mlflow_server(smoke_home, smoke_watched_run):
    """`mlflow server` on a free loopback port over the first run's store (its sqlite file and
    artifacts, as `trainflow up` serves them), started once that run has made the store."""
    with mlflow_server(smoke_home, smoke_home / "mlflow-server.log") as url:
        yield url


@pytest.fixture(scope="session")
def smoke_second_run(smoke_home, smoke_mlflow_server):
    """The second run of the same config in the same home, logged through the server.
    Returns (summary, process)."""
    out = smoke_home / "summary-2.json"
    proc = run_cli(
        smoke_home,
        "run",
        "--config",
        SMOKE,
        "--summary-json",
        str(out),
        MLFLOW_TRACKING_URI=smoke_mlflow_server,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """`trainflow up` on free ports with canary credentials in its environment; `trainflow down`
    at the end of the session unless test_local_stack's last test took it down."""
    home = tmp_path_factory.mktemp("stack-home")
    try:
        yield shared_stack.start(home)
    finally:
        shared_stack.stop(home)
