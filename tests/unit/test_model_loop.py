"""Models, the loop's resume logic, checkpoint round-trips and safety, metrics (no Ray)."""

from __future__ import annotations

import os
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from training.config import ModelConfig
from training.config.overrides import load_config
from training.errors import TrainingDivergedError, UnsafeCheckpointError
from training.inference.evaluate import metrics_from_confusion
from training.loop.checkpoint import load_state, save_state
from training.loop.loop import loop_config, run_loop
from training.manifest import FeatureSpec
from training.model.networks import CNN, MLP, build_model
from training.tracking.flavour import network_from_state


@pytest.mark.parametrize(
    ("cfg", "shape", "expected_type"),
    [
        (ModelConfig(kind="mlp", hidden_sizes=[32, 16]), [64], MLP),
        (ModelConfig(kind="cnn", channels=[4, 8]), [1, 8, 8], CNN),
        (ModelConfig(kind="cnn", channels=[4, 8, 8]), [3, 28, 28], CNN),
    ],
)
def test_models_map_batches_to_logits(cfg, shape, expected_type):
    model = build_model(cfg, shape, 7)
    assert isinstance(model, expected_type)
    flat = torch.randn(5, int(np.prod(shape)))
    assert model(flat).shape == (5, 7)


def test_cnn_needs_an_image_shape():
    with pytest.raises(ValueError, match="image shape"):
        build_model(ModelConfig(kind="cnn"), [64], 10)


SPEC = FeatureSpec(
    label_column="label",
    classes=[0, 1, 2],
    input_shape=[4],
    mean=[0.0] * 4,
    std=[1.0] * 4,
    feature_columns=["a", "b", "c", "d"],
)


def _toy_data(n=60, seed=0):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    features = torch.randn(n, 4, generator=generator) * 0.1
    features[:, 0] += labels.float()  # separable on the first feature
    return features, labels


class FakeContext:
    """Our own stand-in for the Ray contexts: records reports, replays a saved state."""

    world_size = 1
    rank = 0
    strategy = "ddp"

    def __init__(self, state=None, fail_after_epoch=None, fail_at=None):
        self.reports = []
        self.trained = []  # (epoch, batch index) handed to the loop
        self.state = state
        self.fail_after_epoch = fail_after_epoch
        self.fail_at = fail_at  # a (epoch_in_progress, batch) mid-epoch report to fail at
        self.train, self.val = _toy_data(), _toy_data(seed=1)

    def train_batches(self, epoch, batch_size, start=0):
        rows = range(start * batch_size, len(self.train[1]), batch_size)
        for index, first in enumerate(rows, start=start):
            self.trained.append((epoch, index))
            yield (
                self.train[0][first : first + batch_size],
                self.train[1][first : first + batch_size],
            )

    def val_batches(self, batch_size):
        yield self.val

    def prepare_model(self, model):
        return model

    def all_reduce_sum(self, values):
        return values

    def latest_state(self):
        return self.state

    def report(self, metrics, state):
        self.reports.append((metrics, state))
        if self.fail_after_epoch is not None and self.fail_after_epoch == metrics.get("epoch"):
            raise RuntimeError("injected")
        if self.fail_at == (metrics.get("epoch_in_progress"), metrics.get("batch")):
            raise RuntimeError("injected mid-epoch")


def _settings(epochs=4, *sets):
    config = load_config(None, ["train.batch_size=16", "train.lr=0.05", *sets])
    return loop_config(config, SPEC, epochs)


def test_loop_reports_each_epoch_and_learns():
    ctx = FakeContext()
    history = run_loop(_settings(), ctx)
    assert [m["epoch"] for m in history] == [1, 2, 3, 4]
    assert [m["epoch"] for m, _ in ctx.reports] == [1, 2, 3, 4]
    assert history[-1]["val_accuracy"] > 0.9
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_loop_resumes_from_state_with_every_epoch_once():
    first = FakeContext(fail_after_epoch=2)
    with pytest.raises(RuntimeError, match="injected"):
        run_loop(_settings(), first)
    _, state = first.reports[-1]
    resumed = FakeContext(state=state)
    history = run_loop(_settings(), resumed)
    assert [m["epoch"] for m, _ in resumed.reports] == [3, 4]  # no epoch repeated
    assert [m["epoch"] for m in history] == [1, 2, 3, 4]  # history survives the restart
    # Resuming replays exactly what an uninterrupted run computes (seeded per epoch).
    straight = run_loop(_settings(), FakeContext())
    assert history[-1]["val_loss"] == pytest.approx(straight[-1]["val_loss"], rel=1e-5)


def test_loop_resumes_mid_epoch_from_the_saved_batch():
    """every_n_batches=2, 4 batches an epoch; fail at the checkpoint after batch 2 of epoch 2."""
    settings = {**_settings(3, "model.dropout=0"), "every_n_batches": 2}
    first = FakeContext(fail_at=(2, 2))
    with pytest.raises(RuntimeError, match="mid-epoch"):
        run_loop(settings, first)
    metrics, state = first.reports[-1]
    assert (state["epoch"], state["batch"]) == (1, 2)  # one epoch done, two batches of the next
    assert metrics["val_accuracy"] == float("-inf")  # never ranked "best" by Ray
    resumed = FakeContext(state=state)
    history = run_loop(settings, resumed)
    # Epoch 2 (index 1) was trained on batches 0-1 before and 2-3 after the restart: once each.
    before = [b for e, b in first.trained if e == 1]
    after = [b for e, b in resumed.trained if e == 1]
    assert sorted(before + after) == [0, 1, 2, 3]
    assert [m["epoch"] for m in history] == [1, 2, 3]
    # Same result as an uninterrupted run, train_loss of the cut epoch included.
    straight = run_loop(settings, FakeContext())
    for got, want in zip(history, straight, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-6)


def test_loop_refuses_divergence_with_a_fix():
    with pytest.raises(TrainingDivergedError, match="lower train.lr"):
        run_loop(_settings(3, "train.lr=1.0e+30", "train.lr_schedule=constant"), FakeContext())


def test_checkpoint_round_trip_rebuilds_the_same_model(tmp_path):
    ctx = FakeContext()
    run_loop(_settings(2), ctx)
    _, state = ctx.reports[-1]
    save_state(state, str(tmp_path))
    loaded = load_state(str(tmp_path))
    model, spec = network_from_state(loaded)
    assert spec == SPEC
    x = _toy_data()[0][:5]
    reference, _ = network_from_state(state)
    assert torch.equal(model(x), reference(x))
    assert model(x).shape == (5, 3)


class _Exploit:
    """A pickle that runs ``touch marker`` when loaded by a plain unpickler."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def unsafe_checkpoint(tmp_path):
    """A checkpoint directory whose state.pt would run code; and the file that code would create."""
    directory, marker = tmp_path / "checkpoint", tmp_path / "pwned"
    directory.mkdir()
    with open(directory / "state.pt", "wb") as handle:
        pickle.dump({"model": _Exploit(marker)}, handle)
    # The exploit is real: a plain unpickler runs it (so a refusal below is meaningful).
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Exploit(probe)))
    assert probe.exists()
    return directory, marker


def test_checkpoint_with_code_in_its_pickle_is_refused(unsafe_checkpoint):
    directory, marker = unsafe_checkpoint
    with pytest.raises(UnsafeCheckpointError, match="refused to load .*state.pt"):
        load_state(str(directory))
    assert not marker.exists()


def test_loop_resume_refuses_an_unsafe_checkpoint(unsafe_checkpoint):
    """The resume path (Ray's get_checkpoint -> as_directory -> load_state) refuses it too."""
    from ray.train import Checkpoint

    from training.loop.contexts import _RayReporting

    directory, marker = unsafe_checkpoint

    class ResumingContext(_RayReporting, FakeContext):
        _api = SimpleNamespace(get_checkpoint=lambda: Checkpoint.from_directory(str(directory)))
        report = FakeContext.report

    ctx = ResumingContext()
    with pytest.raises(UnsafeCheckpointError):
        run_loop(_settings(), ctx)
    assert ctx.reports == []  # nothing trained from it
    assert not marker.exists()


def test_evaluate_and_promote_loads_refuse_an_unsafe_checkpoint(unsafe_checkpoint):
    from training.loop.checkpoint import load_model_state
    from training.stages.evaluated import load_checkpoint_state

    directory, marker = unsafe_checkpoint
    with pytest.raises(UnsafeCheckpointError):
        load_model_state(str(directory / "state.pt"))
    with pytest.raises(UnsafeCheckpointError):  # the evaluate and promote tasks' loader
        load_checkpoint_state(load_config(None), str(directory))
    assert not marker.exists()


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_cli_refuses_an_unsafe_checkpoint(unsafe_checkpoint, tmp_path, command):
    from typer.testing import CliRunner

    from trainflow.cli import app

    directory, marker = unsafe_checkpoint
    args = [command, "--model", str(directory)]
    if command == "predict":
        args += ["--input", str(directory), "--output", str(tmp_path / "out.parquet")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "refused to load" in result.output
    assert not marker.exists()
    assert not (tmp_path / "out.parquet").exists()


def test_metrics_from_confusion_matrix():
    confusion = np.array([[8, 2], [1, 9]])
    result = metrics_from_confusion(confusion, loss_sum=4.0, class_names=["a", "b"])
    assert result.metrics["test_accuracy"] == pytest.approx(17 / 20)
    assert result.metrics["test_loss"] == pytest.approx(0.2)
    a, b = result.per_class
    assert a["precision"] == pytest.approx(8 / 9) and a["recall"] == pytest.approx(0.8)
    assert b["precision"] == pytest.approx(9 / 11) and b["recall"] == pytest.approx(0.9)
    f1 = [2 * p * r / (p + r) for p, r in ((8 / 9, 0.8), (9 / 11, 0.9))]
    assert result.metrics["test_macro_f1"] == pytest.approx(sum(f1) / 2)


def test_shard_cache_concatenates_batches_in_order_under_the_limit():
    from training.loop.contexts import _collect

    batches = [{"x": torch.arange(4.0) + 4 * i, "y": torch.tensor([i, i])} for i in range(3)]
    cached = _collect(iter(batches), max_bytes=1024)
    assert cached["x"].tolist() == list(range(12))
    assert cached["y"].tolist() == [0, 0, 1, 1, 2, 2]


def test_shard_cache_keeps_nothing_when_the_shard_outgrows_the_limit_but_ends_the_epoch():
    import gc
    import weakref

    from training.loop.contexts import _collect

    read, alive = [], []

    def batches():
        for i in range(10):
            read.append(i)
            batch = torch.zeros(8)  # 32 bytes each
            alive.append(weakref.ref(batch))
            yield {"x": batch}

    assert _collect(batches(), max_bytes=64) is None
    assert read == list(range(10))  # the epoch is read to its end, in step with other workers
    gc.collect()
    assert all(ref() is None for ref in alive)  # and none of it kept
    assert _collect(iter([]), max_bytes=64) is None


def test_a_worker_sizes_its_shard_from_the_manifest_before_reading_it(monkeypatch):
    import ray.train

    from training.loop.contexts import TrainContext

    class Context:
        def get_world_size(self):
            return 2

        def get_world_rank(self):
            return 0

    monkeypatch.setattr(ray.train, "get_context", Context)
    monkeypatch.setattr(ray.train, "get_dataset_shard", lambda split: None)
    row_bytes = 4 * SPEC.num_features + 16
    train_rows = 2 * (1024**2 // row_bytes) + 10  # a bit over 1 MiB per worker
    config = load_config(None, ["train.shard_cache_mb=1"])
    settings = loop_config(config, SPEC, 1, split_rows={"train": train_rows, "val": 100})
    context = TrainContext.from_settings(settings)
    assert context._cache_bytes == {"train": 0, "val": 1024**2}
    settings["split_rows"]["train"] = train_rows - 40  # now it fits
    assert TrainContext.from_settings(settings)._cache_bytes["train"] == 1024**2
    # One epoch reads each shard once: nothing is worth keeping in memory.
    once = loop_config(
        load_config(None, ["train.shard_cache_mb=1", "train.max_epochs=1"]),
        SPEC,
        1,
        split_rows={"train": 10, "val": 10},
    )
    assert TrainContext.from_settings(once)._cache_bytes == {"train": 0, "val": 0}


def _in_memory_context(monkeypatch, rank: int, world: int, arrays: dict):
    """A TrainContext of ``rank`` of ``world`` given in-memory splits (``ray.get`` faked)."""
    import ray
    import ray.train

    from training.loop.contexts import TrainContext

    class Context:
        def get_world_size(self):
            return world

        def get_world_rank(self):
            return rank

    def no_shard(split):
        raise AssertionError("in-memory splits must not ask Ray Data for a shard")

    monkeypatch.setattr(ray.train, "get_context", Context)
    monkeypatch.setattr(ray.train, "get_dataset_shard", no_shard)
    monkeypatch.setattr(ray, "get", lambda ref: arrays[ref])
    config = load_config(None, [])
    settings = loop_config(config, SPEC, 1, split_rows={"train": 11, "val": 5})
    settings["in_memory_splits"] = {"train": "train-ref", "val": "val-ref"}
    return TrainContext.from_settings(settings)


def test_in_memory_splits_give_each_rank_an_equal_disjoint_shard(monkeypatch):
    from training.manifest import SAMPLE_ID

    width = SPEC.num_features
    arrays = {
        f"{split}-ref": (
            np.arange(rows * width, dtype=np.float32).reshape(rows, width),
            np.arange(rows) % 3,
            np.arange(100, 100 + rows),
        )
        for split, rows in (("train", 11), ("val", 5))
    }
    seen = []
    for rank in range(3):
        context = _in_memory_context(monkeypatch, rank, 3, arrays)
        batches = list(context._batches("train", 2, seed=None))
        ids = torch.cat([batch[SAMPLE_ID] for batch in batches]).tolist()
        assert len(ids) == 3  # 11 rows // 3 ranks: every rank the same number of rows
        features, labels = next(context.train_batches(0, 8))
        assert features.dtype == torch.float32 and labels.dtype == torch.int64
        assert len(list(context.val_batches(8))[0][1]) == 1  # 5 // 3
        seen += ids
    assert sorted(seen) == sorted(set(seen)) == list(range(100, 109))  # disjoint, none twice


def test_small_splits_on_one_node_are_handed_over_in_memory_unless_caching_is_off(monkeypatch):
    import ray

    from training.data import read
    from training.loop import ingest
    from training.platform import cluster

    manifest = SimpleNamespace(spec=SPEC, rows={"train": 1000, "val": 200})
    monkeypatch.setattr(cluster, "is_single_node", lambda: True)
    monkeypatch.setattr(read, "load_split_arrays", lambda manifest, split, endpoint: split)
    monkeypatch.setattr(ray, "put", lambda value: f"ref:{value}")
    config = load_config(None, [])
    assert ingest.in_memory_splits(config, manifest, 2) == {"train": "ref:train", "val": "ref:val"}
    off = load_config(None, ["train.shard_cache_mb=0"])  # the user asked to stream every epoch
    assert ingest.in_memory_splits(off, manifest, 2) is None
    monkeypatch.setattr(ingest, "MATERIALIZE_BELOW_BYTES", 1000)  # a split too large
    assert ingest.in_memory_splits(config, manifest, 2) is None
    monkeypatch.setattr(ingest, "MATERIALIZE_BELOW_BYTES", 256 * 1024**2)
    monkeypatch.setattr(cluster, "is_single_node", lambda: False)  # refs would not survive
    assert ingest.in_memory_splits(config, manifest, 2) is None


def test_a_worker_resumes_from_its_own_copy_of_a_remote_checkpoint(tmp_path):
    """Two workers of a node resuming from one S3 checkpoint: Ray's ``as_directory`` shares one
    download directory between them, and while one waits for it the other can delete it
    ("Checkpoint directory ... does not exist, even though it should have been created by
    another process", seen in CI). The loop reads its own copy instead."""
    import shutil
    import threading
    import time

    import pyarrow.fs as pafs
    from ray.air._internal.filelock import TempFileLock
    from ray.train import Checkpoint

    from training.loop.checkpoint import save_state
    from training.loop.contexts import _RayReporting

    saved = tmp_path / "checkpoint_000001"
    saved.mkdir()
    save_state({"epoch": 3, "model": {"w": torch.ones(2)}}, str(saved))
    remote = pafs.PyFileSystem(pafs.FSSpecHandler(__import__("fsspec").filesystem("file")))
    checkpoint = Checkpoint(str(saved), filesystem=remote)

    class Api:
        @staticmethod
        def get_checkpoint():
            return checkpoint

    class Worker(_RayReporting):
        _api = Api

    # The other worker: downloading into the shared directory, then done with it and gone.
    shared = checkpoint._get_temporary_checkpoint_dir()
    os.makedirs(shared, exist_ok=True)
    holding = threading.Event()

    def other_worker():
        with TempFileLock(shared, timeout=0):
            holding.set()
            time.sleep(0.5)
            shutil.rmtree(shared, ignore_errors=True)

    other = threading.Thread(target=other_worker)
    other.start()
    holding.wait(10)
    try:
        state = Worker().latest_state()
    finally:
        other.join()
    assert state["epoch"] == 3
    assert torch.equal(state["model"]["w"], torch.ones(2))
