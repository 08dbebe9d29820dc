"""A Train worker's batches go to its device whether the shard is streamed, cached or handed over
in memory: with one worker nothing else moves them (no DDP wrapper), and a GPU model met CPU
batches in the ResNet-18 run. The device here is torch's ``meta``: a device other than
the CPU that every machine has."""

from __future__ import annotations

import numpy as np
import pytest
import ray.train
import torch

from training.loop.contexts import TrainContext
from training.manifest import FEATURES, LABEL, SAMPLE_ID

ROWS, BATCH = 40, 8
META = torch.device("meta")


class _OneWorker:
    def get_world_size(self):
        return 1

    def get_world_rank(self):
        return 0


class _Shard:
    """A Ray Data shard's ``iter_torch_batches``: chunks as the collate makes them, moved to
    ``device`` as Ray's finalize step does (and refusing to pin what is not on the CPU, as
    torch does: pinning a chunk already on the GPU failed the first fix)."""

    def iter_torch_batches(self, batch_size, device="auto", pin_memory=False, **_):
        for first in range(0, ROWS, batch_size):
            rows = torch.arange(first, min(first + batch_size, ROWS))
            chunk = {FEATURES: rows[:, None].float().repeat(1, 4), LABEL: rows % 3}
            chunk[SAMPLE_ID] = rows
            target = torch.device("cpu") if device == "auto" else torch.device(device)
            yield {key: value.to(target) for key, value in chunk.items()}


@pytest.fixture
def one_worker(monkeypatch):
    monkeypatch.setattr(ray.train, "get_context", _OneWorker)
    monkeypatch.setattr(ray.train, "get_dataset_shard", lambda split: _Shard())


@pytest.mark.parametrize("cache_mb", [0, 64], ids=["streamed", "cached"])
def test_streamed_and_cached_shards_reach_the_device(one_worker, cache_mb):
    ctx = TrainContext(
        seed=0,
        cache_bytes=cache_mb * 1024**2,
        shard_bytes={"train": 1, "val": 1},
        device=META,
        pin_memory=True,  # as use_gpu sets it
    )
    train = list(ctx.train_batches(epoch=0, batch_size=BATCH))
    val = list(ctx.val_batches(batch_size=BATCH))
    assert len(train) == len(val) == ROWS // BATCH
    assert {t.device for batch in train + val for t in batch} == {META}


def test_in_memory_splits_reach_the_device_once(one_worker, monkeypatch):
    arrays = (np.ones((ROWS, 4), np.float32), np.arange(ROWS) % 3, np.arange(ROWS))
    monkeypatch.setattr(ray, "get", lambda ref: ref)  # the "object refs" are the arrays here
    ctx = TrainContext(seed=0, splits={"train": arrays, "val": arrays}, device=META)
    batches = list(ctx.train_batches(epoch=0, batch_size=BATCH))
    assert {t.device for batch in batches for t in batch} == {META}
    assert all(t.device == META for t in ctx._cache["train"].values())  # moved once, kept


def test_the_cpu_default_leaves_batches_where_they_are(one_worker):
    ctx = TrainContext(seed=0, shard_bytes={"train": 1, "val": 1})
    assert {t.device.type for batch in ctx.train_batches(0, BATCH) for t in batch} == {"cpu"}
