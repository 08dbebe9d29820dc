"""Where the loop runs: the ``LoopContext`` it needs, and the two Ray contexts that provide it.

Where Ray Train and Ray Tune differ (data shards, rank, reporting, checkpoints), a small context
object hides it: ``TrainContext`` for TorchTrainer workers, ``TuneContext`` for function trials.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from training.loop.checkpoint import load_state, save_state
from training.manifest import FEATURES, LABEL, SAMPLE_ID, FeatureSpec

Batch = tuple[torch.Tensor, torch.Tensor]


class LoopContext(Protocol):
    """What the loop needs from whoever runs it."""

    world_size: int
    rank: int
    strategy: str  # train.strategy where the workers are Ray Train's; "ddp" in a Tune trial

    def train_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[Batch]: ...
    def val_batches(self, batch_size: int) -> Iterator[Batch]: ...
    def prepare_model(self, model: nn.Module) -> nn.Module: ...
    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor: ...
    def latest_state(self) -> dict[str, Any] | None: ...
    def report(self, metrics: dict[str, float], state: dict[str, Any] | None) -> None: ...


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Each epoch draws dropout masks and order from a seed of its own: resumes replay exactly."""
    return seed * 1_000_003 + epoch * 1_009 + rank


class _RayReporting:
    """Checkpoints and reports through ``ray.train`` or ``ray.tune`` (same API, two modules)."""

    _api: Any  # the ray.train or ray.tune module

    def latest_state(self) -> dict[str, Any] | None:
        checkpoint = self._api.get_checkpoint()
        if checkpoint is None:
            return None
        # A directory of this process's own. ``as_directory`` shares one download directory
        # between the workers of a node when the checkpoint is remote (S3), and the first to
        # finish deletes it while another may still wait for it: "Checkpoint directory ... does
        # not exist, even though it should have been created by another process" (a CI run's
        # restart after a full disk).
        with tempfile.TemporaryDirectory(prefix="trainflow-resume-") as directory:
            return load_state(checkpoint.to_directory(directory))

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

    ``splits`` (small splits on one node, ``ingest.in_memory_splits``): object refs of each
    split's arrays; the worker takes its shard of them directly, with no Ray Data split (whose
    dataset manager and split coordinators are three more processes to start before the first
    batch: ~8 s of a 2-core machine's 20 s train stage on digits).
    """

    def __init__(
        self,
        seed: int,
        pin_memory: bool = False,
        cache_bytes: int = 0,
        shard_bytes: dict[str, int] | None = None,
        strategy: str = "ddp",
        label_dtype: torch.dtype = torch.int64,
        splits: dict[str, Any] | None = None,
        row_bytes: int = 0,
        device: torch.device | None = None,
    ) -> None:
        """``shard_bytes``: each split's size in memory (all workers together), if known;
        ``label_dtype``: int64 class indices, float32 for a regression; ``splits``: object refs
        of (features, labels, sample ids) per split, instead of Ray Data shards; ``row_bytes``:
        a row's size in memory (sizes the chunks the stream fetches); ``device``: where the
        batches go (the worker's GPU with use_gpu; default the CPU)."""
        import ray.train

        from training.platform import heap

        # A streaming worker's Ray Data iterator frees each block it went through; given back,
        # not kept for the rest of the run (``training.platform.heap``).
        heap.keep_releasing()
        self._api = ray.train
        self.strategy = strategy  # train.strategy: ddp | fsdp | deepspeed
        self._seed = seed
        self._label_dtype = label_dtype
        self._row_bytes = row_bytes
        # Page-locked host chunks make the copy to the GPU asynchronous (use_gpu only).
        self._pin_memory = pin_memory
        # Batches are moved here, not left to DDP: one worker's model is not wrapped in DDP,
        # and nothing else would move its inputs (CPU batches met a GPU model in
        # a ResNet-18 run on a GPU).
        self._device = device or torch.device("cpu")
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
        self._splits = splits
        if splits is None:
            self._shards = {
                "train": ray.train.get_dataset_shard("train"),
                "val": ray.train.get_dataset_shard("val"),
            }

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> TrainContext:
        """The context ``loop_config``'s settings ask for (subclasses in tests/benchmarks too)."""
        train = settings["pipeline"]["train"]
        spec = FeatureSpec.from_dict(settings["spec"])
        row_bytes = spec.row_bytes
        rows = settings.get("split_rows") or {}
        # A shard read once (one epoch: one pass of train, one of val) is streamed: a cache would
        # hold up to shard_cache_mb per split per worker for nothing (the 10M-row run).
        cache_mb = int(train["shard_cache_mb"]) if int(train["max_epochs"]) > 1 else 0
        if train["use_gpu"]:
            import ray.train.torch

            device = ray.train.torch.get_device()
        else:
            device = torch.device("cpu")
        return cls(
            seed=train["seed"],
            pin_memory=train["use_gpu"],
            device=device,
            cache_bytes=cache_mb * 1024**2,
            shard_bytes={split: n * row_bytes for split, n in rows.items()},
            strategy=train.get("strategy", "ddp"),
            label_dtype=torch.float32 if spec.is_regression else torch.int64,
            splits=settings.get("in_memory_splits"),
            row_bytes=row_bytes,
        )

    def _stream(self, split: str, batch_size: int, seed: int | None) -> Iterator[dict]:
        """Ray Data batches (features, label, sample_id), shuffled within chunks when ``seed``."""
        # Imported here: ray.data costs a Tune trial's process 0.8 s, and trials never stream.
        from training.loop.collate import SplitCollate, chunk_rows, rebatch

        # Ray moves each chunk to the device in its fetch thread, beside the training step
        # (from page-locked memory with use_gpu); the chunk is cut into batches there.
        chunks = self._shards[split].iter_torch_batches(
            batch_size=chunk_rows(batch_size, self._row_bytes),
            collate_fn=SplitCollate(self._label_dtype),
            device=self._device,
            pin_memory=self._pin_memory,
        )
        yield from rebatch(chunks, batch_size, seed)

    def _on_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` on the worker's device."""
        if self._device.type == "cpu":
            return batch
        return {key: value.to(self._device, non_blocking=True) for key, value in batch.items()}

    def _cached(self, split: str) -> dict[str, torch.Tensor] | None:
        """The whole shard as tensors in shard order, or None when it exceeds the limit."""
        if split not in self._cache:
            if self._splits is not None:
                self._cache[split] = self._shard_of(split)
            else:
                stream = self._stream(split, 4096, None)
                self._cache[split] = _collect(stream, self._cache_bytes[split])
        return self._cache[split]

    def _shard_of(self, split: str) -> dict[str, torch.Tensor]:
        """This rank's rows of an in-memory split: every ``world_size``-th row from ``rank``,
        the same number on every rank (up to ``world_size - 1`` rows left out, as Ray Data's
        equal split does) so that DDP's ranks step in lockstep."""
        import ray

        features, labels, ids = ray.get(self._splits[split])
        per_rank = len(labels) // self.world_size
        rows = slice(self.rank, per_rank * self.world_size, self.world_size)
        shard = {
            FEATURES: torch.tensor(features[rows], dtype=torch.float32),
            LABEL: torch.tensor(labels[rows], dtype=self._label_dtype),
            SAMPLE_ID: torch.tensor(ids[rows], dtype=torch.int64),
        }
        return self._on_device(shard)  # once: every epoch then indexes it in place

    def _batches(self, split: str, batch_size: int, seed: int | None) -> Iterator[dict]:
        in_memory = self._splits is not None or self._cache_bytes[split] > 0
        cached = self._cached(split) if in_memory else None
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
        batches = self._batches("train", batch_size, seed=epoch_seed(self._seed, epoch, self.rank))
        return ((batch[FEATURES], batch[LABEL]) for batch in itertools.islice(batches, start, None))

    def val_batches(self, batch_size: int) -> Iterator[Batch]:
        return ((batch[FEATURES], batch[LABEL]) for batch in self._batches("val", batch_size, None))

    def prepare_model(self, model: nn.Module) -> nn.Module:
        from training.loop.sharding import prepare

        return prepare(model, self.strategy)

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            import ray.train.torch

            # nccl reduces only device tensors; gloo takes CPU ones (get_device() is the CPU).
            values = values.to(ray.train.torch.get_device())
            torch.distributed.all_reduce(values)
        return values.cpu()


class TuneContext(_RayReporting):
    """Inside a plain Tune function trial: one process, in-memory splits, ``ray.tune.report``.

    On a ``device`` other than the CPU (the trial's GPU share) the splits move there once and
    every epoch indexes them in place, as a Train worker's cached shard does.
    """

    world_size = 1
    rank = 0
    strategy = "ddp"  # one process: its model is never wrapped

    def __init__(self, train: Batch, val: Batch, seed: int, device: str = "cpu") -> None:
        import ray.tune

        self._api = ray.tune
        self._device = torch.device(device)
        self._train = tuple(t.to(self._device) for t in train)
        self._val = tuple(t.to(self._device) for t in val)
        self._seed = seed

    def train_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[Batch]:
        features, labels = self._train
        # Drawn on the CPU whatever the device: the same order as a CPU trial's.
        generator = torch.Generator().manual_seed(epoch_seed(self._seed, epoch, 0))
        order = torch.randperm(len(labels), generator=generator).to(self._device)
        for first in range(start * batch_size, len(order), batch_size):
            index = order[first : first + batch_size]
            yield features[index], labels[index]

    def val_batches(self, batch_size: int) -> Iterator[Batch]:
        features, labels = self._val
        for start in range(0, len(labels), batch_size):
            yield features[start : start + batch_size], labels[start : start + batch_size]

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self._device)

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
