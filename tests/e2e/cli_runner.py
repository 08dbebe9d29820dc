"""The real ``trainflow`` CLI in a subprocess, as a user runs it: shared by the e2e tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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


def run_cli(home: Path, *args: str, timeout: int = 900, **env: str) -> subprocess.CompletedProcess:
    """``trainflow ARGS`` from an empty directory (nothing may be written outside the home)."""
    workdir = home / "cwd"
    workdir.mkdir(parents=True, exist_ok=True)
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


def _auth_mode(process) -> str | None:
    """RAY_AUTH_MODE in the process's environment. Ray's agents rewrite their process title over
    the memory /proc/PID/environ reads (it comes back empty): theirs is the one they inherited
    from their parent, the raylet."""
    while process is not None:
        environ = process.environ()
        if environ:
            return environ.get("RAY_AUTH_MODE")
        process = process.parent()
    return None


def run_cli_watching_listeners(
    home: Path, *args: str, timeout: int = 600, every_s: float = 0.5, **env: str
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``run_cli``, sampling the listening sockets of the CLI and every process below it until
    it exits: each listener once, with its process's name, command line and environment."""
    import psutil

    workdir = home / "cwd"
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [*TRAINFLOW, *args],
        cwd=workdir,
        env=cli_env(home, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    import threading

    out: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda k=k, s=s: out.__setitem__(k, s.read()), daemon=True)
        for k, s in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    seen: dict[tuple, dict] = {}
    root = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for member in tree:
            try:
                listening = [
                    c for c in member.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
                ]
                if not listening:
                    continue
                info = {
                    "pid": member.pid,
                    "name": member.name(),
                    "cmdline": member.cmdline(),
                    "driver": member.pid == proc.pid,
                    "auth_mode": _auth_mode(member),
                }
            except psutil.Error:
                continue
            for conn in listening:
                seen.setdefault(
                    (member.pid, conn.laddr.ip, conn.laddr.port),
                    info
                    | {
                        "ip": conn.laddr.ip,
                        "port": conn.laddr.port,
                    },
                )
        time.sleep(every_s)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for reader in readers:
        reader.join()
    completed = subprocess.CompletedProcess(
        proc.args, proc.returncode, out.get("stdout", ""), out.get("stderr", "")
    )
    return completed, list(seen.values())


def run_log_of(proc) -> Path:
    """The run's log file, named on the first line ``trainflow run`` prints."""
    first = proc.stdout.splitlines()[0]
    assert first.startswith("trainflow run: libraries log to "), first
    return Path(first.rsplit(" ", 1)[-1])
