"""A real `mlflow server` on a free loopback port, started as `trainflow up` starts it (the
stack's command and environment): shared by the e2e and integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


@contextlib.contextmanager
def mlflow_server(
    home: Path, log_path: Path, artifacts: Path | None = None, port: int | None = None
):
    """`mlflow server` with ``home``'s sqlite store (``home/mlflow.db``) and ``artifacts``
    (default ``home/mlartifacts``) on ``port`` (default a free one), yielding its URL; stopped
    (its process group) on exit."""
    from deployments.stack import mlflow_command, mlflow_server_environment
    from training.platform.cluster import free_port

    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    destination = str(artifacts or home / "mlartifacts")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            mlflow_command(home, port, destination),
            cwd=home,
            env=mlflow_server_environment(dict(os.environ)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the uvicorn worker stops with it
        )
        try:
            _wait_healthy(url, proc, log_path, timeout_s=120)
            yield url
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # our own server's group only
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail("mlflow server did not start:\n" + log_path.read_text())
        time.sleep(0.5)
