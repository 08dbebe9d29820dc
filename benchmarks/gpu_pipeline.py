"""The default pipeline on a GPU (``train.use_gpu``, bf16) beside the same run on the CPUs.

    python -m benchmarks.gpu_pipeline --reps 1 --out gpu.json

The measure is the whole default `trainflow run` with ``train.use_gpu=true`` and
``train.precision=bf16`` on a lent GPU machine, with its stages, samples/s and accuracy. Each arm
runs `python -m trainflow run` in a fresh home; the arms alternate so that the machine's noise
falls on both. Steady samples/s comes from the run log: the training rows over the seconds
between the first and the last epoch's progress line (start-up and the first epoch excluded).
The GPU arm uses one worker per GPU (at most ``--workers``); the CPU arm the default config.
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
from datetime import datetime
from pathlib import Path

from benchmarks.result_files import machine_info

# "2026-11-25 23:01:58,553 INFO trainflow.progress: train: epoch 1/20, val_accuracy 0.9191"
EPOCH_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO trainflow\.progress: train: epoch (\d+)/(\d+)"
)


def epoch_seconds(log_text: str) -> list[tuple[int, float]]:
    """(epoch, seconds since the epoch) of each final-training epoch line in a run log."""
    stamps = []
    for line in log_text.splitlines():
        found = EPOCH_LINE.match(line)
        if found:
            when = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            stamps.append((int(found[2]), when))
    return stamps


def steady_rows_per_s(stamps: list[tuple[int, float]], train_rows: int) -> float | None:
    """Training rows per second from the first to the last epoch line (no start-up)."""
    if len(stamps) < 2:
        return None
    (first_epoch, first), (last_epoch, last) = stamps[0], stamps[-1]
    if last <= first:
        return None
    return train_rows * (last_epoch - first_epoch) / (last - first)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_arm(overrides: list[str]) -> dict:
    """One `trainflow run` in a fresh home: wall, stages, accuracy, steady samples/s."""
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        home = Path(tmp) / ".trainflow"
        summary = Path(tmp) / "summary.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_"))}
        env = {k: v for k, v in env.items() if not k.startswith("RAY_")}
        env["TRAINFLOW_HOME"] = str(home)
        command = [sys.executable, "-m", "trainflow", "run", "--summary-json", str(summary)]
        for item in overrides:
            command += ["--set", item]
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"trainflow run {overrides} failed:\n{proc.stderr[-4000:]}")
        data = json.loads(summary.read_text())
        log_text = "\n".join(p.read_text() for p in sorted((home / "logs").glob("*.log")))
    train_rows = data["data"]["rows"]["train"]
    stamps = epoch_seconds(log_text)
    rows_per_s = steady_rows_per_s(stamps, train_rows)
    return {
        "overrides": overrides,
        "wall_s": round(wall, 2),
        "stage_seconds": data.get("stage_seconds"),
        "test_accuracy": data["test_metrics"].get("test_accuracy"),
        "epochs": len(stamps),
        "train_rows": train_rows,
        "steady_rows_per_s": round(rows_per_s) if rows_per_s else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="most GPU workers (one per GPU)")
    parser.add_argument("--out", type=Path, default=Path("gpu.json"))
    parser.add_argument("--set", dest="extra", action="append", default=[], help="both arms")
    parser.add_argument("--arms", default="gpu,cpu", help="which arms run (gpu, cpu or both)")
    args = parser.parse_args(argv)
    gpus = gpu_count()
    if gpus == 0 and "gpu" in args.arms.split(","):
        raise SystemExit("no CUDA GPU here: run with --arms cpu, or on a machine with one")
    arms = {
        "gpu": [
            "train.use_gpu=true",
            "train.precision=bf16",
            f"train.num_workers={min(gpus, args.workers)}",
            *args.extra,
        ],
        "cpu": list(args.extra),
    }
    arms = {arm: arms[arm] for arm in args.arms.split(",")}
    reps = []
    for rep in range(args.reps):
        result = {arm: run_arm(overrides) for arm, overrides in arms.items()}
        reps.append(result)
        print(f"rep {rep + 1}: " + json.dumps(result), flush=True)

    import torch

    medians = {arm: statistics.median(rep[arm]["wall_s"] for rep in reps) for arm in arms}
    document = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_info(),
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpus": gpus,
        "reps": reps,
        "median_wall_s": medians,
    }
    if {"gpu", "cpu"} <= medians.keys():
        document["gpu_over_cpu_wall"] = round(medians["gpu"] / medians["cpu"], 2)
    args.out.write_text(json.dumps(document, indent=2))
    print(json.dumps({k: v for k, v in document.items() if k != "reps"}, indent=2))


if __name__ == "__main__":
    main()
