"""`trainflow run` as a process of its own, for the tests that signal or kill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class FlowProcess:
    """`trainflow run` in its own session, so that every process it starts can be found."""

    def __init__(self, home: Path, *args: str) -> None:
        env = {**os.environ, "TRAINFLOW_HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
        for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME"):
            env.pop(key, None)
        (home / "cwd").mkdir(exist_ok=True)
        self.log = home / f"log-{time.time_ns()}.txt"
        self.started = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainflow", "run", *args],
                cwd=home / "cwd",
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wall_s = 0.0

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def run_log(self) -> str:
        """The run's log file, named on the console's first line: Ray workers print there
        (the console shows only trainflow's stage lines)."""
        lines = self.output().splitlines()
        if not lines or not lines[0].startswith("trainflow run: libraries log to "):
            return ""
        path = Path(lines[0].rsplit(" ", 1)[-1])
        return path.read_text(errors="replace") if path.is_file() else ""

    def wait_until(self, condition, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, (
                f"exited early ({self.proc.returncode}):\n" + (self.output()[-4000:])
            )
            assert time.monotonic() < deadline, "timed out:\n" + self.output()[-4000:]
            time.sleep(0.2)

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.wall_s = time.monotonic() - self.started
        return code

    def session(self) -> dict[int, str]:
        """pid -> name of every live process still in the run's session (Ray, Prefect's
        server, ...); read from /proc, so zombies awaiting their parent do not count."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                state = stat.rsplit(")", 1)[1].split()[0]
                if os.getsid(pid) == self.proc.pid and state != "Z":
                    found[pid] = stat[stat.index("(") + 1 : stat.rindex(")")]
            except (OSError, IndexError):
                continue
        return found

    def wait_session_empty(self, timeout: float) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        while (left := self.session()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def kill_session(self) -> None:
        for pid in self.session():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
