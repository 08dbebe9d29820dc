"""B8: ingest at real size: rows/s that reach the training loop, and preprocessing.

Data: ``training.datasets.synthetic.write_table`` (N rows x 64 float32 features, 16 parquet files),
preprocessed once by the pipeline's stage.

Loop pair (same processed train split, same batch size, two passes, the second timed):
- ours: a 1-worker TorchTrainer (``build_trainer``) whose per-worker function iterates
  ``TrainContext.train_batches`` -- exactly what ``run_loop`` consumes, shuffle included --
  with ``train.shard_cache_mb: 0`` and no object-store copy of the split (stream the parquet
  files every epoch, as a split too big to cache does) and a
  model that does nothing (the batch is only counted). Ray Data's ``DataIterator.stats()`` of the
  timed pass is kept in the results.
- anchor: a torch ``DataLoader`` (one loader worker process) over an ``IterableDataset`` that
  reads the same parquet files with ``pyarrow.parquet.ParquetFile.iter_batches`` at the same
  batch size and hands out ``torch.from_numpy`` tensors.

Training pair (reported, no target): the loop's steady rows/s with the default MLP, one worker,
one torch thread -- the loop's own model, optimizer and step (``_build_run``,
``accumulate_gradients``) over ``TrainContext.train_batches`` streamed from the parquet files --
vs bare PyTorch in this process, one thread, the same model and step over in-memory tensors of
the same number of rows (a seeded sample of the split), shuffled batches. Both time
``MLP_TIMED`` batches after ``MLP_WARM`` warm-up batches (fewer on a small split): in its first
seconds an epoch shares the 2 cores with Ray Data reading the split ahead as fast as its
object-store budget allows (~12 s for the 7M-row split), which is not the steady state.

Preprocessing pair: B2's arms (the stage on the local Ray instance vs the same per-batch
functions driven by one pyarrow process) on the generated table.

Rows: 10,000,000 in a full run, ``TRAINFLOW_B8_ROWS`` to choose (e.g. 1,000,000 on a shared
machine), 50,000 in ``--smoke``.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from benchmarks import b8_mlp
from benchmarks import b8_train_stage as stage
from benchmarks import harness as h
from benchmarks.b2_preprocessing import _arrow_arm, _ray_arm
from benchmarks.common import Context, register_by_value, source_config, start_ray, table_data

ID = "B8"
TITLE = "ingest: rows/s delivered to the loop (1 worker, no-op model) vs DataLoader; preprocessing"
TIMEOUT_S = (3600, 300)
BATCH = b8_mlp.BATCH
_LOADER = "torch DataLoader (1 loader process) over the same parquet files, same batch size"
_BARE = "bare PyTorch, 1 thread, same MLP and step over in-memory tensors"
_ARROW = "same transform (training.data per-batch functions) with pyarrow/pandas, one process"
FIGURES = [
    h.FigureSpec(
        ID,
        "loop_ratio",
        "rows/s into the loop, TrainContext stream ÷ DataLoader",
        ">= 0.9",
        _LOADER,
    ),
    h.FigureSpec(ID, "rows_per_s_loop", "rows/s into the loop (1 worker, streaming)", "—", "—"),
    h.FigureSpec(ID, "rows_per_s_loader", "rows/s, torch DataLoader over parquet", "—", "—"),
    h.FigureSpec(
        ID, "preprocess_ratio", "preprocessing rows/s, Ray Data ÷ pyarrow", ">= 0.8", _ARROW
    ),
    h.FigureSpec(ID, "rows_per_s_preprocess_ray", "Ray Data preprocessing rows/s", "—", "—"),
    h.FigureSpec(ID, "rows_per_s_preprocess_arrow", "pyarrow preprocessing rows/s", "—", "—"),
    h.FigureSpec(
        ID,
        "mlp_ratio",
        "steady rows/s training the default MLP: the loop (streamed) ÷ bare PyTorch",
        "— (reported)",
        _BARE,
    ),
    h.FigureSpec(ID, "mlp_rows_per_s_loop", "the loop's steady rows/s, default MLP", "—", "—"),
    h.FigureSpec(ID, "mlp_rows_per_s_bare", "bare PyTorch steady rows/s, default MLP", "—", "—"),
    *stage.FIGURES,
]


def _ingest_worker(settings: dict[str, Any], passes: int) -> dict[str, Any]:
    """``train_loop_per_worker``: the loop's own batches, counted, no model."""
    import torch

    from training.loop.contexts import TrainContext

    torch.set_num_threads(1)
    ctx = TrainContext.from_settings(settings)
    batch = settings["pipeline"]["train"]["batch_size"]
    timings = []
    for epoch in range(passes):
        rows, started = 0, time.perf_counter()
        for _features, labels in ctx.train_batches(epoch, batch):
            rows += len(labels)
        timings.append((rows, time.perf_counter() - started))
    stats = ctx._shards["train"].stats()  # Ray Data's breakdown of the passes
    return {"timings": timings, "stats": stats}


def _loop_arm(config, manifest, storage: str, passes: int):
    import functools

    def run(rep: int) -> dict[str, Any]:
        from training.loop import ingest as ingest_module
        from training.loop import trainer as trainer_module

        # A split under MATERIALIZE_BELOW_BYTES is cached in the object store before fit();
        # a real-size one is not. Stream from the parquet files at every size, as at 10M rows.
        cached_below = ingest_module.MATERIALIZE_BELOW_BYTES
        ingest_module.MATERIALIZE_BELOW_BYTES = 0
        try:
            trainer = trainer_module.build_trainer(
                config,
                manifest,
                name=f"b8-{rep}-{uuid.uuid4().hex[:6]}",
                storage_path=storage,
                num_workers=1,
                train_fn=functools.partial(_ingest_worker, passes=passes),
            )
        finally:
            ingest_module.MATERIALIZE_BELOW_BYTES = cached_below
        out = trainer.fit().return_value
        rows, seconds = out["timings"][-1]
        return {
            "rows": rows,
            "seconds": seconds,
            "rows_per_s": rows / seconds,
            "first_pass_rows_per_s": out["timings"][0][0] / out["timings"][0][1],
            "stats": out["stats"],
        }

    return run


def _parquet_batches(files: list[str], batch_size: int):
    """An IterableDataset over parquet files: (features, labels) tensors of ``batch_size`` rows."""
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import IterableDataset

    from training.manifest import FEATURES, LABEL

    class ParquetBatches(IterableDataset):
        def __iter__(self):
            import warnings

            # Arrow's buffers are read-only; the tensors are only read, as a model would.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for file in files:
                parquet = pq.ParquetFile(file)
                for part in parquet.iter_batches(batch_size=batch_size, columns=[FEATURES, LABEL]):
                    column = part.column(FEATURES)
                    width = column.type.list_size
                    flat = column.flatten().to_numpy(zero_copy_only=False)
                    yield (
                        torch.from_numpy(flat.reshape(-1, width)),
                        torch.from_numpy(part.column(LABEL).to_numpy().astype("int64")),
                    )

    return ParquetBatches()


def _loader_arm(manifest, passes: int):
    import pyarrow.fs as pafs
    from torch.utils.data import DataLoader

    root = manifest.split_uris["train"]
    listing = pafs.LocalFileSystem().get_file_info(pafs.FileSelector(root, recursive=True))
    files = sorted(i.path for i in listing if i.type == pafs.FileType.File)

    def run(rep: int) -> dict[str, Any]:
        loader = DataLoader(
            _parquet_batches(files, BATCH), batch_size=None, num_workers=1, prefetch_factor=4
        )
        timings = []
        for _ in range(passes):
            rows, started = 0, time.perf_counter()
            for _features, labels in loader:
                rows += len(labels)
            timings.append((rows, time.perf_counter() - started))
        rows, seconds = timings[-1]
        return {
            "rows": rows,
            "seconds": seconds,
            "rows_per_s": rows / seconds,
            "first_pass_rows_per_s": timings[0][0] / timings[0][1],
            "files": len(files),
        }

    return run


def run(ctx: Context) -> h.Outcome:
    register_by_value(__name__)
    rows = int(os.environ.get("TRAINFLOW_B8_ROWS") or ctx.pick(10_000_000, 50_000))
    reps = ctx.reps(3, 1)
    passes = 2
    ray = start_ray(4)
    started = time.perf_counter()
    source = table_data(ctx.scratch("data"), rows)
    generate_s = time.perf_counter() - started
    config = source_config(
        source,
        {
            "train.batch_size": BATCH,
            "train.shard_cache_mb": 0,
            "train.max_failures": 0,
            "train.checkpoint.num_to_keep": 1,
        },
    )

    manifests: dict = {}
    pre = {"ray": _ray_arm(ctx, config, manifests), "arrow": _arrow_arm(ctx, config)}
    pre_samples = h.run_alternating(pre, reps, label=f"{ID} preprocess")
    manifest = manifests["latest"]

    storage = str(ctx.scratch("runs"))
    loop = {
        "loop": _loop_arm(config, manifest, storage, passes),
        "loader": _loader_arm(manifest, passes),
    }
    loop_samples = h.run_alternating(loop, reps, label=f"{ID} loop")
    mlp = {
        "mlp_loop": b8_mlp.loop_arm(config, manifest, storage),
        "mlp_bare": b8_mlp.bare_arm(config, manifest),
    }
    mlp_samples = h.run_alternating(mlp, reps, label=f"{ID} MLP")
    stage_figures, stage_samples, stage_params = stage.measure(ctx, storage)

    at = f", {rows:,} rows"

    def col(samples, arm, key="rows_per_s"):
        return h.pluck(samples[arm], key)

    figures = [
        h.Figure(
            "loop_ratio",
            FIGURES[0].name + at,
            "x",
            h.paired_ratios(col(loop_samples, "loop"), col(loop_samples, "loader")),
            anchor=_LOADER,
            target=h.Target(">=", 0.9, ">= 0.9"),
        ),
        h.Figure("rows_per_s_loop", FIGURES[1].name + at, "rows/s", col(loop_samples, "loop")),
        h.Figure("rows_per_s_loader", FIGURES[2].name + at, "rows/s", col(loop_samples, "loader")),
        h.Figure(
            "preprocess_ratio",
            FIGURES[3].name + at,
            "x",
            h.paired_ratios(col(pre_samples, "ray"), col(pre_samples, "arrow")),
            anchor=_ARROW,
            target=h.Target(">=", 0.8, ">= 0.8"),
        ),
        h.Figure(
            "rows_per_s_preprocess_ray", FIGURES[4].name + at, "rows/s", col(pre_samples, "ray")
        ),
        h.Figure(
            "rows_per_s_preprocess_arrow", FIGURES[5].name + at, "rows/s", col(pre_samples, "arrow")
        ),
        h.Figure(
            "mlp_ratio",
            FIGURES[6].name + at,
            "x",
            h.paired_ratios(col(mlp_samples, "mlp_loop"), col(mlp_samples, "mlp_bare")),
            anchor=_BARE,
        ),
        h.Figure(
            "mlp_rows_per_s_loop", FIGURES[7].name + at, "rows/s", col(mlp_samples, "mlp_loop")
        ),
        h.Figure(
            "mlp_rows_per_s_bare", FIGURES[8].name + at, "rows/s", col(mlp_samples, "mlp_bare")
        ),
        *stage_figures,
    ]
    return h.Outcome(
        figures=figures,
        samples={
            **{f"preprocess_{k}": v for k, v in pre_samples.items()},
            **loop_samples,
            **mlp_samples,
            **stage_samples,
        },
        params={
            "rows": rows,
            "split_rows": manifest.rows,
            "features": 64,
            "files": 16,
            "batch_size": BATCH,
            "passes": passes,
            "mlp_warm_and_timed_batches": b8_mlp.warm_and_timed(manifest.rows["train"]),
            "model": config.model.kind,
            "timed_pass": "the last",
            "reps": reps,
            "ray_num_cpus": 4,
            "ray_start_s": ray.get("_start_s"),
            "generate_s": round(generate_s, 1),
            "user_run": stage_params,
        },
        notes=[
            "loop arm: TorchTrainer start-up is not in the figure (only the timed pass); the "
            "splits stream from parquet (not cached in the object store) at every size",
            "the loop's stream shuffles within chunks of 16 batches; the DataLoader reads in order",
        ],
    )
