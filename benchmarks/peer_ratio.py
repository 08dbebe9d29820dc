"""Side by side: the script a user would write instead of trainflow, then `trainflow run`.

    .venv/bin/python -m benchmarks.peer_ratio --peer ../shared/peers/plain_digits.py --reps 3

The peer (plain PyTorch, rung-cut random search, MLflow runs, a registry alias, one process)
and the default `trainflow run` alternate, each in a fresh home (fresh MLflow store, Prefect
database and Ray session), so that both pay the same first-run costs and the machine's noise
falls on both alike. Writes ``benchmarks/results/peer.json``: each arm's wall seconds per rep,
the ratio of medians, trainflow's stage seconds and both test accuracies.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO_ROOT

RESULT = REPO_ROOT / "benchmarks" / "results" / "peer.json"


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RAY_"))}
    # A fresh trainflow home (MLflow store, Prefect database, Ray sessions); the peer writes its
    # MLflow store in its working directory, also fresh. $HOME (pip, matplotlib caches) is the
    # user's, as it would be.
    env["TRAINFLOW_HOME"] = str(home / ".trainflow")
    return env


def _timed(cmd: list[str], home: Path, **env: str) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=home, env={**_clean_env(home), **env}, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout + proc.stderr


def _peer(peer: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        wall, out = _timed([sys.executable, str(peer.resolve())], Path(tmp))
    found = re.search(r"test[ _]acc\w*[=: ]+([0-9.]+)", out)
    return {"wall_s": round(wall, 2), "test_accuracy": float(found[1]) if found else None}


def _trainflow(cold_cache: bool = False) -> dict:
    """One ``trainflow run`` in a fresh home; ``cold_cache``: with an empty user cache too, as
    the first run on a machine (no database templates yet: MLflow and Prefect migrate)."""
    with tempfile.TemporaryDirectory(prefix="trainflow-") as tmp:
        env = {"XDG_CACHE_HOME": str(Path(tmp) / "cache")} if cold_cache else {}
        summary = Path(tmp) / "summary.json"
        cli = Path(sys.executable).with_name("trainflow")
        wall, _ = _timed([str(cli), "run", "--summary-json", str(summary)], Path(tmp), **env)
        data = json.loads(summary.read_text())
    return {
        "wall_s": round(wall, 2),
        "test_accuracy": data.get("test_metrics", {}).get("test_accuracy"),
        "stages_s": data.get("stage_seconds"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peer", type=Path, default=REPO_ROOT.parent / "shared/peers/plain_digits.py"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--cold-db",
        action="store_true",
        help="add a third arm: trainflow with an empty user cache, as the first run on a "
        "machine (MLflow and Prefect migrate their databases in the fresh home)",
    )
    args = parser.parse_args(argv)
    if not args.peer.is_file():
        raise SystemExit(f"no peer script at {args.peer}; pass --peer PATH")
    reps = []
    for rep in range(args.reps):
        pair = {"peer": _peer(args.peer), "trainflow": _trainflow()}
        if args.cold_db:
            pair["trainflow_cold_db"] = _trainflow(cold_cache=True)
        reps.append(pair)
        walls = ", ".join(f"{arm} {run['wall_s']} s" for arm, run in pair.items())
        print(f"rep {rep + 1}: {walls}", flush=True)
    medians = {arm: statistics.median(r[arm]["wall_s"] for r in reps) for arm in reps[0]}
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_at_start": os.getloadavg()[0],
        "reps": reps,
        "peer_median_s": medians["peer"],
        "trainflow_median_s": medians["trainflow"],
        "ratio_of_medians": round(medians["trainflow"] / medians["peer"], 2),
    }
    if args.cold_db:
        result["trainflow_cold_db_median_s"] = medians["trainflow_cold_db"]
        result["cold_db_ratio_of_medians"] = round(
            medians["trainflow_cold_db"] / medians["peer"], 2
        )
    RESULT.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "reps"}, indent=2))


if __name__ == "__main__":
    main()
