"""One `trainflow up` stack (Prefect server, worker, MLflow server on free ports) for the modules
that test the stack: test_operations.py, then test_local_stack.py, whose last test is `down`.

Starting a stack is ~75 s of a busy 2-core machine; one start fewer for the suite. Under
``make test`` both modules go to one pytest worker, operations first (tests/conftest.py:
RUNS_WITH, LONGEST_FIRST). Each module keeps its own state: test_local_stack's runs use the smoke
config's experiment and model, test_operations' runs their own, so neither sees the other's
versions or champion.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from cli_runner import free_port, run_cli

# Canary credentials in the environment of `up` (so of the servers and the worker, and of every
# flow run the worker starts): none may reach the stack's logs or any file under the home.
CANARIES = {
    "AWS_ACCESS_KEY_ID": "AKIASTACKCANARY9Z1",
    "AWS_SECRET_ACCESS_KEY": "stack-canary-secret-55e0",
    "MLFLOW_TRACKING_TOKEN": "stack-canary-mlflow-token-2b7c",
    "PREFECT_API_KEY": "stack-canary-prefect-key-9d03",
}
UP_TIMEOUT_S = 240


def start(home: Path) -> dict:
    """`trainflow up` in ``home`` on free ports: the home, its state, the ports, the seconds."""
    ports = {"prefect": free_port(), "mlflow": free_port()}
    started = time.monotonic()
    proc = run_cli(
        home, "up", "--prefect-port", str(ports["prefect"]), "--mlflow-port",
        str(ports["mlflow"]), "--timeout", str(UP_TIMEOUT_S), timeout=UP_TIMEOUT_S + 60,
        **CANARIES,
    )  # fmt: skip
    up_seconds = time.monotonic() - started
    print(f"\ntrainflow up took {up_seconds:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads((home / "stack" / "state.json").read_text())
    return {"home": home, "state": state, "ports": ports, "up_seconds": up_seconds}


def stop(home: Path) -> None:
    """`trainflow down`, unless a test already took the stack down."""
    if (home / "stack" / "state.json").exists():
        run_cli(home, "down", timeout=120)
