"""The processes of the local stack: start one as a process-group leader, tell whether it still
runs, and stop its whole group. Touches no process it did not start (PIDs are checked against
their start time, so a reused PID is never signalled)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

STOP_GRACE_S = 10.0


@dataclass
class Part:
    """One process `up` started (a process-group leader)."""

    name: str
    pid: int
    create_time: float
    command: list[str]
    log: str
    url: str | None = None
    port: int | None = None

    def is_running(self) -> bool:
        return same_process(self.pid, self.create_time)


def process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def same_process(pid: int, create_time: float) -> bool:
    """True if ``pid`` is alive and is the process we started (not a reused PID)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _pid_reused(part: Part) -> bool:
    """The recorded PID now names a younger, unrelated process (a zombie leader is still ours:
    its group's children may live on)."""
    started = process_start_time(part.pid)
    return started is not None and abs(started - part.create_time) >= 1.0


def group_members(part: Part) -> list[int]:
    """PIDs of live processes in the part's process group.

    The kernel does not hand out a PID that is still some group's id, so while any member of
    our group lives the id is ours; if the PID instead belongs to a younger, unrelated process
    (our group died out and the number was reused), nothing is ours."""
    import psutil

    if _pid_reused(part):
        return []
    members = []
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if os.getpgid(proc.pid) != part.pid:
                continue
            if proc.info["create_time"] + 1.0 < part.create_time:
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def port_is_free(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers do: a port left in TIME_WAIT by a stopped server is free, a listener
        # is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def start_process(name: str, command: list[str], env: dict[str, str], log: Path, cwd: Path) -> Part:
    """Start ``command`` in a new session, its output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # A new session makes the process a group leader: `down` stops it with its children.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    started = process_start_time(proc.pid) or time.time()
    return Part(name=name, pid=proc.pid, create_time=started, command=command, log=str(log))


def log_tail(part: Part, lines: int = 15) -> str:
    try:
        text = Path(part.log).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def stop_parts(parts: list[Part], grace_s: float = STOP_GRACE_S) -> list[str]:
    """SIGTERM each part's process group in turn, SIGKILL what is left after the grace period;
    returns the names of the parts that were running. Touches no other process."""
    stopped = []
    for part in parts:
        if not group_members(part) and not part.is_running():
            continue
        stopped.append(part.name)
        _signal_group(part, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_members(part):
            time.sleep(0.2)
        if group_members(part):
            _signal_group(part, signal.SIGKILL)
            kill_deadline = time.monotonic() + 5.0
            while time.monotonic() < kill_deadline and group_members(part):
                time.sleep(0.1)
    return stopped


def _signal_group(part: Part, sig: int) -> None:
    if part.is_running():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(part.pid, sig)
        return
    # The leader is gone but children of ours may live on: signal them one by one.
    for pid in group_members(part):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
