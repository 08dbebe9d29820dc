"""B2: preprocessing rows/s, our Ray Data stage vs the same transform in one pyarrow process.

Ray arm: ``training.data.preprocess`` (read -> validate/summarise -> fit train statistics ->
transform -> partitioned parquet) into an empty storage root, on the local Ray instance.
Anchor: the very same functions of ``training.data`` (``batch_summary``, ``validate``,
``feature_spec``, ``output_rows``) driven by plain pyarrow/pandas in this one process:
``ParquetFile.iter_batches`` twice, ``pq.write_to_dataset`` partitioned by split. Data: 1x = the
default data (scikit-learn's 1,797 digits), 10x and 100x = the digits tiled and jittered
(``training.datasets.synthetic``), same columns.

Second pair: one pass over the processed train split with ``Dataset.iter_torch_batches`` (as the
training loop reads it: materialised, shuffled within chunks of batches) vs a torch
``DataLoader`` over a ``TensorDataset`` of the same rows (shuffled), same batch size.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks.common import Context, fresh_preprocess, source_config, start_ray, tabular_digits

ID = "B2"
TITLE = (
    "preprocessing rows/s: Ray Data stage vs one pyarrow process; iter_torch_batches vs DataLoader"
)
TIMEOUT_S = (900, 240)
_ANCHOR = "same transform (training.data per-batch functions) with pyarrow/pandas, one process"
FIGURES = [
    h.FigureSpec(
        ID,
        "ratio_10x",
        "preprocessing rows/s, Ray Data ÷ pyarrow, 10x default data",
        ">= 0.8",
        _ANCHOR,
    ),
    h.FigureSpec(
        ID, "ratio_1x", "preprocessing rows/s, Ray Data ÷ pyarrow, 1x default data", "—", _ANCHOR
    ),
    h.FigureSpec(
        ID,
        "ratio_100x",
        "preprocessing rows/s, Ray Data ÷ pyarrow, 100x default data",
        "—",
        _ANCHOR,
    ),
    h.FigureSpec(ID, "rows_per_s_ray_10x", "Ray Data stage rows/s, 10x", "—", "—"),
    h.FigureSpec(ID, "rows_per_s_arrow_10x", "pyarrow one-process rows/s, 10x", "—", "—"),
    h.FigureSpec(
        ID,
        "loader_ratio",
        "rows/s, iter_torch_batches ÷ torch DataLoader (train split)",
        "—",
        "torch DataLoader over a TensorDataset, same rows and batch",
    ),
]


def arrow_preprocess(config, files: list[str], out_dir: Path) -> int:
    """The preprocessing transform without Ray: same per-batch code, one process; rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.data.inputs import input_format
    from training.data.preprocess import BATCH_ROWS
    from training.data.rows import SPLIT, output_rows
    from training.data.schema import check_schema
    from training.data.summary import Stats, batch_summary
    from training.data.validate import feature_spec, validate

    cfg = config.data
    plan = check_schema(cfg, files, input_format(cfg, files), None)

    def batches():
        for file in files:
            reader = pq.ParquetFile(file)
            for record_batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=plan.columns):
                yield record_batch.to_pandas()

    stats = Stats()
    for batch in batches():
        stats.add(batch_summary(batch, plan, cfg.split) if len(batch) else {"rows": 0})
    task, _reason, classes = validate(stats, cfg, plan, files)
    spec = feature_spec(stats, cfg, plan, classes, task)
    table = pa.concat_tables(output_rows(batch, spec, cfg.split) for batch in batches())
    pq.write_to_dataset(table, str(out_dir), partition_cols=[SPLIT])
    return table.num_rows


def _ray_arm(ctx: Context, config, manifests: dict):
    def run(rep: int) -> dict[str, Any]:
        manifest, seconds, _ = fresh_preprocess(config, ctx.scratch("ray-out"))
        rows = sum(manifest.rows.values())
        manifests.setdefault("latest", manifest)
        return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}

    return run


def _arrow_arm(ctx: Context, config):
    from training.data.inputs import resolve_inputs

    files = resolve_inputs(config.data)

    def run(rep: int) -> dict[str, Any]:
        started = time.perf_counter()
        rows = arrow_preprocess(config, files, ctx.scratch("arrow-out"))
        seconds = time.perf_counter() - started
        return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}

    return run


def _loader_arms(manifest, batch_size: int, passes: int):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from training.data.read import load_split_arrays, read_split
    from training.loop.collate import SplitCollate, chunk_rows, rebatch
    from training.manifest import LABEL

    dataset = read_split(manifest, "train").materialize()  # as the trainer keeps small splits
    features, labels, _ = load_split_arrays(manifest, "train")
    tensors = TensorDataset(torch.from_numpy(features), torch.from_numpy(labels))
    row_bytes = features.shape[1] * 4 + 16

    def ray_iter(rep: int) -> dict[str, Any]:
        rows = 0
        started = time.perf_counter()
        for epoch in range(passes):
            # As TrainContext streams a split: chunks of batches, shuffled within each chunk.
            chunks = dataset.iter_torch_batches(
                batch_size=chunk_rows(batch_size, row_bytes), collate_fn=SplitCollate()
            )
            for batch in rebatch(chunks, batch_size, seed=rep * 1000 + epoch):
                rows += len(batch[LABEL])
        seconds = time.perf_counter() - started
        return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}

    def torch_loader(rep: int) -> dict[str, Any]:
        rows = 0
        started = time.perf_counter()
        for epoch in range(passes):
            generator = torch.Generator().manual_seed(rep * 1000 + epoch)
            loader = DataLoader(tensors, batch_size=batch_size, shuffle=True, generator=generator)
            for _features, batch_labels in loader:
                rows += len(batch_labels)
        seconds = time.perf_counter() - started
        return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}

    return {"ray_iter_torch_batches": ray_iter, "torch_dataloader": torch_loader}


def run(ctx: Context) -> h.Outcome:
    scales = ctx.pick([1, 10, 100], [1])
    reps = ctx.reps(3, 2)
    ray = start_ray(4)
    data_dir = ctx.scratch("data")
    configs = {scale: source_config(tabular_digits(data_dir, scale)) for scale in scales}
    manifests: dict[int, dict] = {scale: {} for scale in scales}

    # Warm-up (not measured; full runs only): Ray's first tasks start worker processes and
    # import pandas/pyarrow; the anchor's first call imports the same modules.
    if not ctx.smoke:
        _ray_arm(ctx, configs[scales[0]], {})(0)
        _arrow_arm(ctx, configs[scales[0]])(0)

    arms = {}
    for scale in scales:
        arms[f"ray_x{scale}"] = _ray_arm(ctx, configs[scale], manifests[scale])
        arms[f"arrow_x{scale}"] = _arrow_arm(ctx, configs[scale])
    samples = h.run_alternating(arms, reps, label=f"{ID} preprocess")

    biggest = scales[-1]
    batch_size = 64
    passes = ctx.pick(1 if biggest >= 100 else 5, 2)
    loaders = _loader_arms(manifests[biggest]["latest"], batch_size, passes)
    loader_samples = h.run_alternating(loaders, reps, label=f"{ID} loaders")

    figures = []
    for scale in scales:
        ray_rps = h.pluck(samples[f"ray_x{scale}"], "rows_per_s")
        arrow_rps = h.pluck(samples[f"arrow_x{scale}"], "rows_per_s")
        figures.append(
            h.Figure(
                f"ratio_{scale}x",
                f"preprocessing rows/s, Ray Data ÷ pyarrow, {scale}x default data",
                "x",
                h.paired_ratios(ray_rps, arrow_rps),
                anchor=_ANCHOR,
                target=h.Target(">=", 0.8, ">= 0.8") if scale == 10 else None,
            )
        )
        figures.append(
            h.Figure(
                f"rows_per_s_ray_{scale}x", f"Ray Data stage rows/s, {scale}x", "rows/s", ray_rps
            )
        )
        figures.append(
            h.Figure(
                f"rows_per_s_arrow_{scale}x",
                f"pyarrow one-process rows/s, {scale}x",
                "rows/s",
                arrow_rps,
            )
        )
    ray_iter = h.pluck(loader_samples["ray_iter_torch_batches"], "rows_per_s")
    torch_rows = h.pluck(loader_samples["torch_dataloader"], "rows_per_s")
    figures.append(
        h.Figure(
            "loader_ratio",
            f"rows/s, iter_torch_batches ÷ torch DataLoader ({biggest}x train split)",
            "x",
            h.paired_ratios(ray_iter, torch_rows),
            anchor="torch DataLoader over a TensorDataset, same rows and batch",
        )
    )
    figures.append(
        h.Figure("rows_per_s_iter_torch_batches", "iter_torch_batches rows/s", "rows/s", ray_iter)
    )
    figures.append(
        h.Figure("rows_per_s_dataloader", "torch DataLoader rows/s", "rows/s", torch_rows)
    )
    if 10 not in scales:
        figures.insert(
            0,
            h.Figure(
                "ratio_10x",
                "preprocessing rows/s ratio at 10x (not run: smoke)",
                "x",
                [],
                anchor=_ANCHOR,
                target=h.Target(">=", 0.8, ">= 0.8"),
            ),
        )
    return h.Outcome(
        figures=figures,
        samples={**samples, **loader_samples},
        params={
            "scales": scales,
            "rows": {f"{s}x": sum(manifests[s]["latest"].rows.values()) for s in scales},
            "reps": reps,
            "batch_rows": 4096,
            "loader_batch_size": batch_size,
            "loader_passes": passes,
            "loader_rows": manifests[biggest]["latest"].rows["train"],
            "ray_num_cpus": 4,
            "ray_start_s": ray.get("_start_s"),
            "warm_up": "none (smoke)"
            if ctx.smoke
            else "one unmeasured run of each preprocessing arm at the smallest scale",
        },
        notes=[
            "rows/s = input rows / seconds of the whole stage call (both passes and the write)",
            "the Ray arm's time excludes Ray's start (done once before), includes every "
            "Ray Data execution the stage starts",
        ],
    )
