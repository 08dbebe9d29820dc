"""The smoke pipeline's shared parts: its config, the first run's canary credentials, the Ray
sessions a home holds, and an `mlflow server` over a home's store (tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_runner import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")

# Issue 5, case 11 and issue 17: the first run carries canary credentials; none may be written
# anywhere, Ray's session logs included.
CANARIES = {
    "AWS_ACCESS_KEY_ID": "AKIACANARY7QX2LKEYID",
    "AWS_SECRET_ACCESS_KEY": "canary-secret-3f9d1c0b7e5a",
    "AWS_SESSION_TOKEN": "canary-session-token-8b2e",
    "MLFLOW_TRACKING_TOKEN": "canary-mlflow-token-6a4f",
    "MLFLOW_TRACKING_PASSWORD": "canary-mlflow-password-1c9e",
    "PREFECT_API_KEY": "canary-prefect-key-77d1",
}


def ray_sessions(home: Path) -> list[Path]:
    """The Ray sessions under the home: <home>/ray is the runs' Ray temp dir, or a link to it
    when the home is too deep for Unix socket paths (read through the link)."""
    return [p for p in (home / "ray").resolve().iterdir() if p.name.startswith("session_2")]


@contextlib.contextmanager
def mlflow_server(home: Path, log_path: Path):
    """`mlflow server` on a free loopback port with the home's sqlite store and artifacts,
    yielding its URL; stopped (its whole process group) on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"),
                *("--port", str(port), "--workers", "1"),
                *("--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}"),
                *("--artifacts-destination", str(home / "mlartifacts")),
            ],
            cwd=home,
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
