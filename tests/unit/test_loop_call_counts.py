"""The loop's work per epoch does not grow with the number of epochs: counted calls, not timers.

``run_loop`` runs E and then 2E epochs in the two real contexts (a Tune function trial's
in-memory splits; a Train worker's shard, cached and streamed), with only Ray's reporting and
shard source replaced. Whatever happens per epoch (batches, iterator set-ups, shard reads,
reports, checkpoints, scheduler steps) must count the same per epoch in both runs; what happens
once per run (the model build, the resume lookup, prepare_model, reading a cached shard) must
not happen again.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import training.loop.loop as loop_module
from training.config.overrides import load_config
from training.loop.contexts import TrainContext, TuneContext
from training.loop.loop import loop_config, run_loop
from training.manifest import FEATURES, LABEL, SAMPLE_ID, FeatureSpec

SPEC = FeatureSpec(
    label_column="label",
    classes=[0, 1, 2],
    input_shape=[4],
    mean=[0.0] * 4,
    std=[1.0] * 4,
    feature_columns=["a", "b", "c", "d"],
)
ROWS, VAL_ROWS, BATCH = 96, 30, 16
EPOCHS = 3
BUILD_MODEL = loop_module.build_model
SCHEDULER_STEP = torch.optim.lr_scheduler.LRScheduler.step


def _data(rows: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % 3
    features = torch.randn(rows, 4, generator=generator) * 0.1
    features[:, 0] += labels.float()
    return features, labels


class Counting:
    """Counts the loop's calls into its context (mixed into both real contexts)."""

    calls: Counter

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    def train_batches(self, epoch, batch_size, start=0):
        self._count("train_batches")
        for batch in super().train_batches(epoch, batch_size, start):
            self._count("train_batch")
            yield batch

    def val_batches(self, batch_size):
        self._count("val_batches")
        for batch in super().val_batches(batch_size):
            self._count("val_batch")
            yield batch

    def prepare_model(self, model):
        self._count("prepare_model")
        return super().prepare_model(model)

    def latest_state(self):
        self._count("latest_state")
        return None

    def report(self, metrics, state):
        self._count("report")
        if state is not None:
            self._count("checkpoint")
            # The one thing a checkpoint carries that grows: the history, one row per epoch
            # done (by design: it survives restarts that way; a few floats per epoch).
            assert len(state["history"]) == state["epoch"]


class CountingTuneContext(Counting, TuneContext):
    def __init__(self) -> None:
        self.calls = Counter()
        super().__init__(_data(ROWS, 0), _data(VAL_ROWS, 1), seed=0)


class FakeShard:
    """A Ray Train dataset shard: counts how often it is read (``iter_torch_batches``)."""

    def __init__(self, name: str, rows: int, calls: Counter) -> None:
        self.name, self.calls = name, calls
        features, labels = _data(rows, 0 if name == "train" else 1)
        self.columns = {FEATURES: features, LABEL: labels, SAMPLE_ID: torch.arange(rows)}

    def iter_torch_batches(self, batch_size, **_):
        self.calls[f"read_{self.name}_shard"] += 1
        rows = len(self.columns[LABEL])
        for first in range(0, rows, batch_size):
            yield {k: v[first : first + batch_size] for k, v in self.columns.items()}


class CountingTrainContext(Counting, TrainContext):
    def prepare_model(self, model):  # no DDP with one worker outside Ray Train
        self._count("prepare_model")
        return model


def _train_context(monkeypatch, cache_mb: int) -> CountingTrainContext:
    import ray.train

    calls: Counter = Counter()

    class Context:
        def get_world_size(self):
            return 1

        def get_world_rank(self):
            return 0

    monkeypatch.setattr(ray.train, "get_context", Context)
    rows = {"train": ROWS, "val": VAL_ROWS}
    monkeypatch.setattr(
        ray.train, "get_dataset_shard", lambda split: FakeShard(split, rows[split], calls)
    )
    ctx = CountingTrainContext(
        seed=0, cache_bytes=cache_mb * 1024**2, shard_bytes={"train": 1, "val": 1}
    )
    ctx.calls = calls
    return ctx


def _run(ctx, epochs: int, monkeypatch) -> Counter:
    counts = ctx.calls
    build_model, step = BUILD_MODEL, SCHEDULER_STEP  # the originals, not a previous run's wraps

    def counting_build(*args, **kwargs):
        counts["build_model"] += 1
        return build_model(*args, **kwargs)

    def counting_step(self, *args, **kwargs):
        counts["scheduler_step"] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(loop_module, "build_model", counting_build)
    monkeypatch.setattr(torch.optim.lr_scheduler.LRScheduler, "step", counting_step)
    config = load_config(None, [f"train.batch_size={BATCH}", "train.lr=0.05"])
    history = run_loop(loop_config(config, SPEC, epochs), ctx)
    assert [row["epoch"] for row in history] == list(range(1, epochs + 1))
    return counts


# Once per run, whatever the epochs; the rest once (or a fixed number of times) per epoch.
ONCE = {"build_model", "latest_state", "prepare_model"}


def _per_epoch(counts: Counter, epochs: int, once: set[str] = ONCE) -> dict[str, float]:
    # The scheduler steps once when it is built (torch does), then once per epoch.
    per_run = {"scheduler_step": 1}
    return {key: (n - per_run.get(key, 0)) / epochs for key, n in counts.items() if key not in once}


def _assert_constant_per_epoch(short: Counter, long: Counter, once: set[str] = ONCE) -> None:
    for key in once:
        assert short[key] == long[key] == 1, (key, short[key], long[key])
    assert _per_epoch(short, EPOCHS, once) == _per_epoch(long, 2 * EPOCHS, once)


@pytest.fixture
def contexts(monkeypatch):
    return lambda make: (_run(make(), EPOCHS, monkeypatch), _run(make(), 2 * EPOCHS, monkeypatch))


def test_a_tune_trial_does_the_same_work_every_epoch(contexts):
    short, long = contexts(CountingTuneContext)
    _assert_constant_per_epoch(short, long)
    assert _per_epoch(long, 2 * EPOCHS) == {
        "train_batches": 1,  # one iterator set-up (one permutation) per epoch
        "train_batch": ROWS / BATCH,
        "val_batches": 1,
        "val_batch": 2,  # 30 rows in batches of 16
        "report": 1,
        "checkpoint": 1,
        "scheduler_step": 1,
    }


def test_a_train_worker_reads_a_cached_shard_once_whatever_the_epochs(contexts, monkeypatch):
    short, long = contexts(lambda: _train_context(monkeypatch, cache_mb=1))
    # The shard is read through Ray Data once per run, then indexed in memory every epoch.
    once = ONCE | {"read_train_shard", "read_val_shard"}
    _assert_constant_per_epoch(short, long, once)
    assert long["train_batch"] == 2 * EPOCHS * ROWS / BATCH


def test_a_train_worker_streams_its_shard_once_per_epoch_without_a_cache(contexts, monkeypatch):
    short, long = contexts(lambda: _train_context(monkeypatch, cache_mb=0))
    _assert_constant_per_epoch(short, long)
    assert _per_epoch(long, 2 * EPOCHS)["read_train_shard"] == 1
    assert _per_epoch(long, 2 * EPOCHS)["read_val_shard"] == 1
