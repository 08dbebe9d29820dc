"""B8's guard on the user's run at size: one worker, one epoch, no sweep,
the default batch and MLP, over a 3M-row table of 32 float32 features in 16 parquet files.

On 2026-11-23 that run's train stage took 66-68 s on the 2-core machine: 3,000,000 / 66 s
~ 45,000 table rows per second of train stage (``REFERENCE_ROWS_PER_S``). The arm times
``build_trainer(...).fit()`` as ``train_final`` runs it (the train stage less its MLflow calls)
and, inside the worker, ``run_loop`` itself (its epoch: the train split streamed from parquet
as at 3M rows, validation and the checkpoint), so a regression shows on its side of the fit.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks.common import Context, fresh_preprocess, register_by_value, source_config

#: The reported run's size (``TRAINFLOW_B8_STAGE_ROWS`` picks another).
ROWS, FEATURES, FILES = 3_000_000, 32, 16
#: 2026-11-23: 3M rows, train stage 66-68 s; rows of the table per second.
REFERENCE_ROWS_PER_S = 3_000_000 / 66
REFERENCE = "2026-11-23: 3,000,000 rows, train stage 66 s (45,455 rows/s), 2-core machine"
_ID = "B8"
_AT = "1 worker, 1 epoch, batch 64, 32 features"
FIGURES = [
    h.FigureSpec(
        _ID,
        "stage_vs_2026_11_23",
        "train-stage rows/s of the user's run ÷ 2026-11-23's (3M rows / 66 s)",
        ">= 0.9",
        REFERENCE,
    ),
    h.FigureSpec(_ID, "stage_rows_per_s", "train-stage rows/s (table rows ÷ fit)", "—", "—"),
    h.FigureSpec(
        _ID, "stage_loop_rows_per_s", "the loop's rows/s (train split ÷ run_loop)", "—", "—"
    ),
    h.FigureSpec(_ID, "stage_preprocess_s", "preprocessing the same table", "—", "—"),
]
OVERRIDES = {"train.num_workers": 1, "train.max_epochs": 1, "sweep.enabled": False}


def stage_table(directory: Path, rows: int, seed: int = 0) -> str:
    """``rows`` x 32 float32 features with a learnable label, 16 parquet files."""
    from training.datasets.synthetic import write_table

    target = directory / f"table-{rows}-x{FEATURES}-s{seed}"
    if not target.exists():
        write_table(target, rows, seed, n_features=FEATURES, num_files=FILES)
    return str(target)


def timed_train_worker(settings: dict[str, Any]) -> dict[str, Any]:
    """``train_worker`` with a stopwatch: the loop's seconds beside its history."""
    from training.loop.loop import train_worker
    from training.loop.records import unpack

    started = time.perf_counter()
    history, _, _ = unpack(train_worker(settings))
    return {"history": history, "loop_s": time.perf_counter() - started}


def stage_arm(config, manifest, storage: str, table_rows: int):
    """One rep: the run's fit, timed from build_trainer (datasets, start-up, loop, checkpoint)."""
    from training.loop import trainer as trainer_module

    def run(rep: int) -> dict[str, Any]:
        started = time.perf_counter()
        trainer = trainer_module.build_trainer(
            config,
            manifest,
            name=f"b8-stage-{rep}-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            num_workers=1,
            train_fn=timed_train_worker,
        )
        out = trainer.fit().return_value
        stage_s = time.perf_counter() - started
        train_rows = manifest.rows["train"]
        return {
            "stage_s": stage_s,
            "loop_s": out["loop_s"],
            "stage_rows_per_s": table_rows / stage_s,
            "loop_rows_per_s": train_rows / out["loop_s"],
            "vs_reference": table_rows / stage_s / REFERENCE_ROWS_PER_S,
            "val_accuracy": out["history"][-1]["val_accuracy"],
        }

    return run


def measure(ctx: Context, storage: str) -> tuple[list[h.Figure], dict[str, Any], dict[str, Any]]:
    """(figures, samples, params) of the user's run at ``ROWS`` (50,000 in ``--smoke``)."""
    register_by_value(__name__)
    rows = int(os.environ.get("TRAINFLOW_B8_STAGE_ROWS") or ctx.pick(ROWS, 50_000))
    source = stage_table(ctx.scratch("stage-data"), rows)
    config = source_config(source, OVERRIDES)
    manifest, preprocess_s, _ = fresh_preprocess(config, ctx.scratch("stage-store"))
    samples = h.run_alternating(
        {"stage": stage_arm(config, manifest, storage, rows)}, ctx.reps(3, 1), label="B8 stage"
    )["stage"]
    at = f", {rows:,} rows, {_AT}"
    spec = {f.key: f for f in FIGURES}
    figures = [
        h.Figure(
            "stage_vs_2026_11_23",
            spec["stage_vs_2026_11_23"].name + at,
            "x",
            h.pluck(samples, "vs_reference"),
            anchor=REFERENCE,
            target=h.Target(">=", 0.9, ">= 0.9"),
        ),
        h.Figure(
            "stage_rows_per_s",
            spec["stage_rows_per_s"].name + at,
            "rows/s",
            h.pluck(samples, "stage_rows_per_s"),
        ),
        h.Figure(
            "stage_loop_rows_per_s",
            spec["stage_loop_rows_per_s"].name + at,
            "rows/s",
            h.pluck(samples, "loop_rows_per_s"),
        ),
        h.Figure("stage_preprocess_s", spec["stage_preprocess_s"].name + at, "s", [preprocess_s]),
    ]
    params = {"rows": rows, "features": FEATURES, "files": FILES, "split_rows": manifest.rows}
    return figures, {"stage": samples}, params
