"""A real `prefect server start` on a loopback port, as `trainflow up` starts it (the stack's
command and environment), that a test can stop and start again on the same port and database."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

START_TIMEOUT_S = 180  # a migration on a busy 2-core machine


class PrefectServer:
    """One server's port, home (its sqlite database) and log; ``start``/``stop`` as often as a
    test likes, each start with the same database."""

    def __init__(self, home: Path, port: int) -> None:
        self.home = home
        self.port = port
        self.api_url = f"http://127.0.0.1:{port}/api"
        self._proc: subprocess.Popen | None = None
        self._starts = 0

    def start(self) -> float:
        """Start and wait until it answers; returns the seconds that took."""
        from deployments.stack import base_environment, prefect_command

        env = base_environment(self.home)
        env.pop("PREFECT_API_URL", None)  # a client setting
        self._starts += 1
        log_path = self.home / f"prefect-server-{self._starts}.log"
        started = time.monotonic()
        with log_path.open("w") as log:
            self._proc = subprocess.Popen(
                prefect_command(self.port),
                cwd=self.home,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: uvicorn's children stop with it
            )
        while not self.answers():
            if self._proc.poll() is not None or time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail("prefect server did not start:\n" + log_path.read_text()[-4000:])
            time.sleep(0.3)
        return time.monotonic() - started

    def stop(self) -> None:
        """Stop our server's process group (SIGTERM, then SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def post(self, path: str, body: bytes = b"{}"):
        import json

        request = urllib.request.Request(
            f"{self.api_url}/{path}",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)
