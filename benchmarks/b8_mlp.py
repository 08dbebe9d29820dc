"""B8's training pair: the loop's steady rows/s with the default MLP (one worker, one torch
thread, its own model, optimizer and step over ``TrainContext.train_batches`` streamed from the
parquet files) beside bare PyTorch in this process over in-memory tensors of as many rows
(docs: benchmarks/b8_ingest.py)."""

from __future__ import annotations

import time
import uuid
from typing import Any

BATCH = 512
MLP_WARM, MLP_TIMED = 3000, 600  # batches, at most a third of the split's each


def warm_and_timed(train_rows: int) -> tuple[int, int]:
    """(warm-up, timed) batches of the MLP pair: MLP_WARM and MLP_TIMED, at most a third of the
    split's batches each."""
    third = max(1, train_rows // BATCH // 3)
    return min(MLP_WARM, third), min(MLP_TIMED, third)


def _timed_steps(
    model, optimizer, loss_fn, batches, micro: int, train_rows: int
) -> dict[str, float]:
    """Optimizer steps over ``batches``: rows/s of the timed steps after the warm-up ones."""
    from training.loop.loop import accumulate_gradients

    warm, timed = warm_and_timed(train_rows)
    rows, started = 0, time.perf_counter()
    for done, (features, labels) in enumerate(batches):
        if done == warm:
            rows, started = 0, time.perf_counter()
        if done == warm + timed:
            break
        optimizer.zero_grad(set_to_none=True)
        accumulate_gradients(model, loss_fn, features, labels, micro)
        optimizer.step()
        rows += len(labels)
    seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}


def _mlp_worker(settings: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker``: the loop's model and step over its streamed batches."""
    import torch

    from training.loop.contexts import TrainContext
    from training.loop.loop import _build_run

    torch.set_num_threads(1)
    ctx = TrainContext.from_settings(settings)
    run = _build_run(settings, ctx)
    model = ctx.prepare_model(run.model)
    batches = ctx.train_batches(0, run.batch_rows)
    train_rows = settings["split_rows"]["train"]
    out = _timed_steps(model, run.optimizer, run.loss_fn, batches, run.micro_rows, train_rows)
    for _ in batches:  # the epoch read to its end, as the loop does
        pass
    return {**out, "stats": ctx._shards["train"].stats()}


def loop_arm(config, manifest, storage: str):
    from training.loop import ingest as ingest_module
    from training.loop import trainer as trainer_module

    def run(rep: int) -> dict[str, Any]:
        cached_below = ingest_module.MATERIALIZE_BELOW_BYTES
        ingest_module.MATERIALIZE_BELOW_BYTES = 0  # streamed, as at 10M rows
        try:
            trainer = trainer_module.build_trainer(
                config,
                manifest,
                name=f"b8-mlp-{rep}-{uuid.uuid4().hex[:6]}",
                storage_path=storage,
                num_workers=1,
                train_fn=_mlp_worker,
            )
        finally:
            ingest_module.MATERIALIZE_BELOW_BYTES = cached_below
        return trainer.fit().return_value

    return run


def bare_arm(config, manifest):
    """Plain PyTorch, this process, one thread: the same MLP and step on in-memory tensors."""
    import torch
    from torch import nn

    from training.data.read import load_split_arrays
    from training.model.networks import build_model

    spec = manifest.spec
    train_rows = manifest.rows["train"]
    rows = sum(warm_and_timed(train_rows)) * BATCH
    features, labels, _ = load_split_arrays(manifest, "train", sample_rows=rows)
    features, labels = torch.from_numpy(features), torch.from_numpy(labels)

    def batches(seed: int):
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
        for first in range(0, len(labels), BATCH):
            index = order[first : first + BATCH]
            yield features[index], labels[index]

    def run(rep: int) -> dict[str, Any]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch.manual_seed(rep)
            model = build_model(config.model, spec.input_shape, spec.num_outputs, spec.task)
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay
            )
            loss_fn = nn.CrossEntropyLoss(reduction="sum")
            return _timed_steps(model, optimizer, loss_fn, batches(rep), BATCH, train_rows)
        finally:
            torch.set_num_threads(threads)

    return run
