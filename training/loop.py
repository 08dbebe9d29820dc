"""The training loop, written once; run by Tune trials and by Ray Train workers alike.

Where Ray Train and Ray Tune differ (data shards, rank, reporting, checkpoints), a small context
object hides it: ``TrainContext`` for TorchTrainer workers, ``TuneContext`` for function trials.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import pickle
import tempfile
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from training.config import PipelineConfig, validate_config
from training.errors import TrainingDivergedError, UnsafeCheckpointError
from training.manifest import FEATURES, LABEL, SAMPLE_ID, FeatureSpec
from training.model import build_model

STATE_FILE = "state.pt"

Batch = tuple[torch.Tensor, torch.Tensor]


class LoopContext(Protocol):
    """What the loop needs from whoever runs it."""

    world_size: int
    rank: int

    def train_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[Batch]: ...
    def val_batches(self, batch_size: int) -> Iterator[Batch]: ...
    def prepare_model(self, model: nn.Module) -> nn.Module: ...
    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor: ...
    def latest_state(self) -> dict[str, Any] | None: ...
    def report(self, metrics: dict[str, float], state: dict[str, Any] | None) -> None: ...


def loop_config(
    config: PipelineConfig,
    spec: FeatureSpec,
    max_epochs: int,
    every_n_batches: int = 0,
    max_workers: int = 1,
    split_rows: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The plain-data argument every worker/trial receives (picklable, JSON-able).

    ``every_n_batches`` > 0 adds mid-epoch checkpoints (final training only: in a sweep every
    report is one ASHA iteration, so trials report once per epoch). ``max_workers`` sizes the
    micro-batches that keep the global batch constant when an elastic group shrinks.
    ``split_rows`` (the manifest's rows per split) lets a worker size its shard before reading it.
    """
    return {
        "pipeline": config.model_dump(mode="json"),
        "spec": spec.to_dict(),
        "max_epochs": max_epochs,
        "every_n_batches": every_n_batches,
        "max_workers": max_workers,
        "split_rows": dict(split_rows or {}),
    }


def step_plan(global_batch: int, world_size: int, max_workers: int) -> tuple[int, int]:
    """(rows per worker per optimizer step, rows per forward pass).

    The global batch is split across the workers there are, so an elastic group that lost
    workers still steps on ``global_batch`` rows (exactly when the worker count divides it).
    Each worker accumulates gradients over micro-batches no larger than at full size
    (``global_batch / max_workers``), so its memory per forward pass does not grow.
    """
    per_worker = max(1, global_batch // world_size)
    micro = max(1, math.ceil(global_batch / max(max_workers, world_size)))
    return per_worker, min(micro, per_worker)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def run_loop(settings: dict[str, Any], ctx: LoopContext) -> list[dict[str, float]]:
    """Train for ``max_epochs``, reporting once per epoch; resume from the context's state.

    Returns the full per-epoch history (also kept in every checkpoint so it survives restarts).
    """
    config = validate_config(settings["pipeline"])
    spec = FeatureSpec.from_dict(settings["spec"])
    max_epochs = int(settings["max_epochs"])
    train_cfg = config.train
    seed_everything(train_cfg.seed + ctx.rank)

    model = build_model(config.model, spec.input_shape, spec.num_classes)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=train_cfg.lr, weight_decay=train_cfg.weight_decay
    )
    scheduler = (
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_epochs)
        if train_cfg.lr_schedule == "cosine"
        else torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    )
    history: list[dict[str, float]] = []
    start_epoch, start_batch, partial = 0, 0, None
    state = ctx.latest_state()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch = int(state["epoch"])  # epochs completed
        history = list(state["history"])
        # A mid-epoch checkpoint: batches done in epoch ``start_epoch`` and their loss totals.
        start_batch, partial = int(state.get("batch", 0)), state.get("partial_totals")
        if start_batch and state.get("world_size", ctx.world_size) != ctx.world_size:
            # An elastic resize changed every rank's shard: a batch position of the old split
            # means nothing in the new one, so the epoch restarts (its first part seen twice).
            start_batch, partial = 0, None
        if ctx.rank == 0:  # in the worker's log: a restart or re-run continued, not restarted
            print(
                f"trainflow: resuming at epoch {start_epoch + 1} of {max_epochs} from a checkpoint"
            )

    model = ctx.prepare_model(model)
    # The global batch is split across workers so results do not depend on the worker count.
    per_worker_batch, micro_batch = step_plan(
        train_cfg.batch_size, ctx.world_size, int(settings.get("max_workers", 1))
    )
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    bf16 = train_cfg.precision == "bf16"

    every_n = int(settings.get("every_n_batches") or 0)
    worst = -math.inf if train_cfg.checkpoint.score_order == "max" else math.inf

    def state_of(epoch: int, **extra: Any) -> dict[str, Any] | None:
        if ctx.rank != 0:
            return None
        return {
            "model": _unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epoch": epoch,
            "history": list(history),  # a copy: in-process contexts keep the dict
            "spec": spec.to_dict(),
            "model_config": config.model.model_dump(mode="json"),
            **extra,
        }

    def mid_epoch_checkpoint(epoch: int, done: int, totals: torch.Tensor) -> None:
        if not every_n or done % every_n:
            return
        # Every rank reaches this point together (equal shards); the summed partial loss lets
        # a resumed epoch report the same train_loss. The worst score keeps it from ever
        # ranking as "best"; Ray Train still resumes from it as the latest.
        totals = ctx.all_reduce_sum(totals)
        extra = {"batch": done, "partial_totals": totals.tolist(), "world_size": ctx.world_size}
        metrics = {"epoch_in_progress": epoch + 1, "batch": done}
        metrics[train_cfg.checkpoint.score_attribute] = worst
        ctx.report(metrics, state_of(epoch, **extra))

    for epoch in range(start_epoch, max_epochs):
        torch.manual_seed(_epoch_seed(train_cfg.seed, epoch, ctx.rank))
        resume = (start_batch, partial) if epoch == start_epoch else (0, None)
        train_loss = _train_epoch(
            model,
            optimizer,
            loss_fn,
            ctx,
            epoch,
            per_worker_batch,
            micro_batch,
            bf16,
            *resume,
            mid_epoch_checkpoint,
        )
        val_loss, val_accuracy = _validate(model, loss_fn, ctx, per_worker_batch)
        if not math.isfinite(train_loss) or not math.isfinite(val_loss):
            raise TrainingDivergedError(
                f"training diverged at epoch {epoch + 1}: train_loss={train_loss}, "
                f"val_loss={val_loss} (lr={train_cfg.lr:g}); lower train.lr or the sweep's "
                "train.lr range"
            )
        metrics = {
            "epoch": epoch + 1,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "lr": optimizer.param_groups[0]["lr"],
            # Elastic groups change size between attempts: the history shows each epoch's.
            "workers": float(ctx.world_size),
        }
        scheduler.step()
        history.append(metrics)
        ctx.report(metrics, state_of(epoch + 1, metrics=metrics))
    return history


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Each epoch draws dropout masks and order from a seed of its own: resumes replay exactly."""
    return seed * 1_000_003 + epoch * 1_009 + rank


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def _train_epoch(
    model,
    optimizer,
    loss_fn,
    ctx: LoopContext,
    epoch: int,
    batch_size: int,
    micro: int,
    bf16: bool,
    start_batch: int = 0,
    partial: list[float] | None = None,
    after_batch=None,
) -> float:
    """One epoch from batch ``start_batch`` on (``partial``: the global loss totals before it)."""
    model.train()
    totals = torch.zeros(2, dtype=torch.float64)  # loss sum, rows
    if partial is not None and ctx.rank == 0:  # counted once: the next all-reduce sums ranks
        totals += torch.tensor(partial, dtype=torch.float64)
    batches = ctx.train_batches(epoch, batch_size, start_batch)
    for done, (features, labels) in enumerate(batches, start=start_batch + 1):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = accumulate_gradients(model, loss_fn, features, labels, micro, bf16)
        optimizer.step()
        totals += torch.tensor([loss_sum, len(labels)], dtype=torch.float64)
        if after_batch is not None:
            after_batch(epoch, done, totals)
    totals = ctx.all_reduce_sum(totals)
    return float(totals[0] / max(totals[1].item(), 1.0))


def accumulate_gradients(
    model, loss_fn, features: torch.Tensor, labels: torch.Tensor, micro: int, bf16: bool = False
) -> float:
    """Backward over the batch in micro-batches of at most ``micro`` rows; returns the loss sum.

    Each micro-batch's summed loss is divided by the whole batch's rows, so the accumulated
    gradient equals one pass over the whole batch. DDP all-reduces once, on the last one.
    """
    rows, loss_total = len(labels), 0.0
    for start in range(0, rows, micro):
        last = start + micro >= rows
        no_sync = getattr(model, "no_sync", None)
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with torch.autocast(features.device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(features[start : start + micro])
            loss = loss_fn(logits.float(), labels[start : start + micro])
            (loss / rows).backward()
        loss_total += loss.item()
    return loss_total


@torch.no_grad()
def _validate(model, loss_fn, ctx: LoopContext, batch_size: int) -> tuple[float, float]:
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, rows
    for features, labels in ctx.val_batches(batch_size):
        logits = model(features)
        correct = (logits.argmax(dim=1) == labels).sum().item()
        totals += torch.tensor(
            [loss_fn(logits, labels).item(), correct, len(labels)], dtype=torch.float64
        )
    # All-reduce so every rank (and rank 0's report that Tune sees) has the global metrics.
    totals = ctx.all_reduce_sum(totals)
    rows = max(totals[2].item(), 1.0)
    return float(totals[0] / rows), float(totals[1] / rows)


def save_state(state: dict[str, Any], directory: str) -> str:
    path = os.path.join(directory, STATE_FILE)
    torch.save(state, path)
    return path


def load_state(directory: str) -> dict[str, Any]:
    """Load a checkpoint's state; ``weights_only=True`` refuses pickles that would run code.

    Every path that reads a checkpoint (loop resume, evaluate, predict, promote) comes here.
    """
    path = os.path.join(directory, STATE_FILE)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = (str(exc).strip().splitlines() or ["unpickling refused"])[0][:200]
        raise UnsafeCheckpointError(
            f"refused to load {path}: it holds objects other than tensors and plain data, so "
            f"loading it could run code ({reason}); use a checkpoint written by trainflow"
        ) from None


class _RayReporting:
    """Checkpoints and reports through ``ray.train`` or ``ray.tune`` (same API, two modules)."""

    _api: Any  # the ray.train or ray.tune module

    def latest_state(self) -> dict[str, Any] | None:
        checkpoint = self._api.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            return load_state(directory)

    def report(self, metrics: dict[str, float], state: dict[str, Any] | None) -> None:
        if state is None:
            self._api.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            save_state(state, tmp)
            self._api.report(metrics, checkpoint=self._api.Checkpoint.from_directory(tmp))


class TrainContext(_RayReporting):
    """Inside a Ray Train worker: Ray Data shards, DDP, ``ray.train.report``.

    A shard smaller than ``cache_bytes`` is read once through Ray Data and kept as tensors
    (on the worker's device): epochs then index it like ``TuneContext`` does. Re-streaming a
    small shard every epoch cost ~30 % of a 1-core CNN's throughput (benchmark B1), although
    the batches themselves arrive in well under a second per epoch.
    """

    def __init__(
        self,
        seed: int,
        pin_memory: bool = False,
        cache_bytes: int = 0,
        shard_bytes: dict[str, int] | None = None,
    ) -> None:
        """``shard_bytes``: each split's size in memory (all workers together), if known."""
        import ray.train

        self._api = ray.train
        self._seed = seed
        # Page-locked host batches make the copy to the GPU asynchronous (use_gpu only).
        self._pin_memory = pin_memory
        self._cache: dict[str, dict[str, torch.Tensor] | None] = {}
        context = ray.train.get_context()
        self.world_size = context.get_world_size()
        self.rank = context.get_world_rank()
        # A split known to be too large is never collected: the stream is the only read of it.
        self._cache_bytes = {
            split: cache_bytes
            if math.ceil((shard_bytes or {}).get(split, 0) / self.world_size) <= cache_bytes
            else 0
            for split in ("train", "val")
        }
        self._shards = {
            "train": ray.train.get_dataset_shard("train"),
            "val": ray.train.get_dataset_shard("val"),
        }

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> TrainContext:
        """The context ``loop_config``'s settings ask for (subclasses in tests/benchmarks too)."""
        train = settings["pipeline"]["train"]
        # float32 features, int64 label and sample id per row
        row_bytes = 4 * FeatureSpec.from_dict(settings["spec"]).num_features + 16
        rows = settings.get("split_rows") or {}
        return cls(
            seed=train["seed"],
            pin_memory=train["use_gpu"],
            cache_bytes=int(train["shard_cache_mb"]) * 1024**2,
            shard_bytes={split: n * row_bytes for split, n in rows.items()},
        )

    def _stream(self, split: str, batch_size: int, seed: int | None) -> Iterator[dict]:
        """Ray Data batches (features, label, sample_id), locally shuffled when ``seed``."""
        shuffle = {"local_shuffle_buffer_size": 4 * batch_size, "local_shuffle_seed": seed}
        yield from self._shards[split].iter_torch_batches(
            batch_size=batch_size,
            dtypes={FEATURES: torch.float32, LABEL: torch.int64, SAMPLE_ID: torch.int64},
            pin_memory=self._pin_memory,
            **(shuffle if seed is not None else {}),
        )

    def _cached(self, split: str) -> dict[str, torch.Tensor] | None:
        """The whole shard as tensors in shard order, or None when it exceeds the limit."""
        if split not in self._cache:
            self._cache[split] = _collect(self._stream(split, 4096, None), self._cache_bytes[split])
        return self._cache[split]

    def _batches(self, split: str, batch_size: int, seed: int | None) -> Iterator[dict]:
        cached = self._cached(split) if self._cache_bytes[split] > 0 else None
        if cached is None:
            yield from self._stream(split, batch_size, seed)
            return
        rows = len(cached[LABEL])
        if seed is None:
            order = None
        else:  # a full permutation: shuffles better than the stream's local buffer
            order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
            order = order.to(cached[LABEL].device)
        for first in range(0, rows, batch_size):
            if order is None:
                yield {key: value[first : first + batch_size] for key, value in cached.items()}
            else:
                index = order[first : first + batch_size]
                yield {key: value[index] for key, value in cached.items()}

    def train_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[Batch]:
        # The order is a function of (seed, epoch, rank) over a deterministic split (see
        # build_trainer's preserve_order), so skipping ``start`` batches resumes mid-epoch.
        batches = self._batches("train", batch_size, seed=_epoch_seed(self._seed, epoch, self.rank))
        return ((batch[FEATURES], batch[LABEL]) for batch in itertools.islice(batches, start, None))

    def val_batches(self, batch_size: int) -> Iterator[Batch]:
        return ((batch[FEATURES], batch[LABEL]) for batch in self._batches("val", batch_size, None))

    def prepare_model(self, model: nn.Module) -> nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model)

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            import ray.train.torch

            # nccl reduces only device tensors; gloo takes CPU ones (get_device() is the CPU).
            values = values.to(ray.train.torch.get_device())
            torch.distributed.all_reduce(values)
        return values.cpu()


class TuneContext(_RayReporting):
    """Inside a plain Tune function trial: one process, in-memory splits, ``ray.tune.report``."""

    world_size = 1
    rank = 0

    def __init__(self, train: Batch, val: Batch, seed: int) -> None:
        import ray.tune

        self._api = ray.tune
        self._train, self._val, self._seed = train, val, seed

    def train_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[Batch]:
        features, labels = self._train
        generator = torch.Generator().manual_seed(_epoch_seed(self._seed, epoch, 0))
        order = torch.randperm(len(labels), generator=generator)
        for first in range(start * batch_size, len(order), batch_size):
            index = order[first : first + batch_size]
            yield features[index], labels[index]

    def val_batches(self, batch_size: int) -> Iterator[Batch]:
        features, labels = self._val
        for start in range(0, len(labels), batch_size):
            yield features[start : start + batch_size], labels[start : start + batch_size]

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values


def _collect(batches: Iterator[dict], max_bytes: int) -> dict[str, torch.Tensor] | None:
    """Concatenate ``batches`` unless they add up to more than ``max_bytes`` (then None)."""
    parts: dict[str, list[torch.Tensor]] = {}
    size = 0
    for batch in batches:
        size += sum(value.element_size() * value.nelement() for value in batch.values())
        if size > max_bytes:
            # Larger than its estimate: read to the end, keeping nothing. A streaming split's
            # epochs run in step across workers, so an epoch left half-read could stall them.
            for _ in batches:
                pass
            return None
        for key, value in batch.items():
            parts.setdefault(key, []).append(value)
    if not parts:
        return None  # an empty shard: nothing to cache, the stream yields nothing
    return {key: torch.cat(values) for key, values in parts.items()}


def train_worker(settings: dict[str, Any]) -> list[dict[str, float]]:
    """``train_loop_per_worker`` of the TorchTrainer."""
    return run_loop(settings, TrainContext.from_settings(settings))
