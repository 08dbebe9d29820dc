"""The real ``trainflow`` CLI in a subprocess, as a user runs it: shared by the e2e tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

TRAINFLOW = [sys.executable, "-m", "trainflow"]
# Service addresses of the developer's shell must not leak into a test's private home.
SERVICE_VARS = ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME")


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment with ``home`` as the trainflow home, no service addresses, ``extra``."""
    env = {**os.environ, "TRAINFLOW_HOME": str(home)}
    for key in SERVICE_VARS:
        env.pop(key, None)
    env.update(extra)
    return env


def run_cli(home: Path, *args: str, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """``trainflow ARGS`` from an empty directory (nothing may be written outside the home)."""
    workdir = home / "cwd"
    workdir.mkdir(exist_ok=True)
    return subprocess.run(
        [*TRAINFLOW, *args],
        cwd=workdir,
        env=cli_env(home, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
