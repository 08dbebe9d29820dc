"""The test suite as a newcomer meets it, against the plain peer script on the same machine.

    .venv/bin/python -m benchmarks.suite_ratio --peer ../shared/peers/plain_digits.py

A fresh clone of this checkout's HEAD with an empty ``HOME`` (every cache cold: pip's wheels,
DeepSpeed's and matplotlib's caches, the database templates); ``make .venv/.installed-test``;
the peer script three times with that venv; then the suite exactly as ``make test`` runs it, with
``--durations=25``. Writes ``benchmarks/results/suite.json`` (the wall seconds of each part, the
ratio of the suite to the peer's median, pytest's closing line) and keeps pytest's output beside
the clone. About 45 minutes on 2 cores: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO_ROOT
from benchmarks.result_files import machine_info

RESULT = REPO_ROOT / "benchmarks" / "results" / "suite.json"
GOAL_X = 65
# What `make test` runs after its install (Makefile: test).
SUITE = ["-m", "pytest", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]


def _timed(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, int]:
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    return time.perf_counter() - started, code


def measure(peer: Path, work: Path) -> dict:
    clone = work / "trainflow"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    home = work / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RAY_"))}
    env["HOME"] = str(home)
    install_s, code = _timed(["make", ".venv/.installed-test"], clone, env, work / "install.log")
    if code:
        raise SystemExit(f"the install failed: {work / 'install.log'}")
    python = str(clone / ".venv" / "bin" / "python")
    peer_s = []
    for rep in range(3):
        wall, code = _timed([python, str(peer)], work, env, work / f"peer-{rep}.log")
        if code:
            raise SystemExit(f"the peer script failed: {work / f'peer-{rep}.log'}")
        peer_s.append(round(wall, 1))
    log = work / "suite.log"
    suite_s, code = _timed([python, *SUITE, "--durations=25"], clone, env, log)
    closing = [
        line for line in log.read_text().splitlines() if re.search(r"\d+ (passed|failed)", line)
    ]
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_info(),
        "install_s": round(install_s, 1),
        "peer_s": peer_s,
        "suite_s": round(suite_s, 1),
        "ratio": round(suite_s / statistics.median(peer_s), 1),
        "goal_x": GOAL_X,
        "exit_code": code,
        "pytest": closing[-1].strip("= ") if closing else "",
        "log": str(log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peer", type=Path, default=REPO_ROOT.parent / "shared/peers/plain_digits.py"
    )
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="trainflow-suite-"))
    result = measure(args.peer.resolve(), work)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
