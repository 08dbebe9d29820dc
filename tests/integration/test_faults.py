"""Training faults injected for real on one local Ray instance.

Model: Ray's own train/v2/tests/test_persistence.py (fail at chosen iterations, the same run name
resumes) and test_report_fault_tolerance.py (checkpoint upload failure).

The fault is injected by a wrapper around the real per-worker loop (``_faulty_worker``): it runs
``run_loop`` with a ``TrainContext`` subclass that records, per batch, the sample ids it trained
on and, at a chosen (rank, epoch, batch) on the first attempt only, kills itself from outside
(the test sends SIGKILL), raises, or hangs.
"""

from __future__ import annotations

import errno
import functools
import io
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray.cloudpickle as cloudpickle
import torch
from fsspec.implementations.local import LocalFileSystem

from training.config.overrides import load_config
from training.errors import StorageError, WorkerFailedError
from training.loop.checkpoint import load_state
from training.loop.contexts import TrainContext
from training.loop.loop import run_loop
from training.loop.trainer import train_final
from training.manifest import SAMPLE_ID
from training.storage import StorageLayout

pytestmark = pytest.mark.integration

# Test-local worker functions and the quota filesystem travel to Ray workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _config(*sets: str):
    return load_config(None, ["train.num_workers=2", "train.max_epochs=2", *sets])


# -- the fault injector (runs inside Ray Train workers) -------------------------------------------


def _faulty_worker(settings):
    """The real loop, with a context that logs sample ids and fires one fault on attempt 1."""
    fault = settings["fault"]
    where = Path(fault["dir"])
    fired = where / "fired"
    first_attempt = not fired.exists()

    class FaultyContext(TrainContext):
        def _batches(self, split, batch_size, seed):
            for batch in super()._batches(split, batch_size, seed):
                self.last_ids = batch[SAMPLE_ID].tolist()
                yield batch

        def train_batches(self, epoch, batch_size, start=0):
            log = where / f"seen-rank{self.rank}.jsonl"
            batches = super().train_batches(epoch, batch_size, start)
            for index, batch in enumerate(batches, start=start + 1):
                if (
                    first_attempt
                    and self.rank == fault["rank"]
                    and (epoch + 1, index) == (fault["epoch"], fault["batch"])
                ):
                    _fire(fault, fired)
                with open(log, "a") as handle:  # logged as the batch is handed to the loop
                    record = {"first": first_attempt, "epoch": epoch + 1, "batch": index}
                    handle.write(json.dumps({**record, "ids": self.last_ids}) + "\n")
                yield batch

    return run_loop(settings, FaultyContext.from_settings(settings))


def _fire(fault, fired: Path) -> None:
    fired.write_text(str(time.time()))
    if fault["kind"] == "raise":
        raise RuntimeError("injected fault in one rank")
    if fault["kind"] == "hang":
        time.sleep(3600)  # stops making progress; only a timeout can end this attempt
    if fault["kind"] == "sigkill":
        _wait_for_checkpoint(fault.get("after_checkpoint"))
        (fired.parent / "pid").write_text(str(os.getpid()))
        time.sleep(300)  # mid-epoch: wait here for the test's SIGKILL
        raise AssertionError("the test never killed this worker")


def _wait_for_checkpoint(expected: dict | None, timeout_s: float = 120) -> None:
    """Wait until Ray Train has registered the checkpoint whose metrics include ``expected``
    (its snapshot file names the latest one), so the kill lands after a known checkpoint."""
    if not expected:
        return
    snapshot = Path(expected.pop("snapshot"))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            latest = json.loads(snapshot.read_text())["latest_checkpoint_result"] or {}
        except (OSError, ValueError, KeyError):
            latest = {}
        if expected.items() <= latest.get("metrics", {}).items():
            return
        time.sleep(0.1)


def _inject(monkeypatch, tmp_path, **fault) -> Path:
    """Every loop_config built by trainer.py carries the fault description."""
    from training.loop import trainer as trainer_module

    fault_dir = tmp_path / "fault"
    fault_dir.mkdir()
    real = trainer_module.loop_config
    monkeypatch.setattr(
        trainer_module,
        "loop_config",
        lambda *a, **k: {**real(*a, **k), "fault": {"dir": str(fault_dir), **fault}},
    )
    return fault_dir


def _seen(fault_dir: Path) -> list[dict]:
    rows = []
    for log in sorted(fault_dir.glob("seen-rank*.jsonl")):
        rows += [json.loads(line) for line in log.read_text().splitlines()]
    return rows


def _kill_when_ready(fault_dir: Path, timeout_s: float = 300) -> threading.Thread:
    """SIGKILL the worker that wrote its pid, from this (the test) process."""

    def killer():
        deadline = time.monotonic() + timeout_s
        pid_file = fault_dir / "pid"
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            (fault_dir / "killed").write_text(str(pid))

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    return thread


# -- cases 1 + 6: SIGKILL mid-epoch, one MLflow run, no sample seen twice -------------------------


@pytest.mark.slow
def test_sigkilled_worker_resumes_mid_epoch_in_one_mlflow_run(
    manifest, layout, tmp_path, monkeypatch
):
    from tasks import stages
    from training.stages import train as train_stage
    from training.tracking import store

    every_n = 5
    config = _config("train.max_failures=1", f"train.checkpoint.every_n_batches={every_n}")
    snapshot = Path(stages.StorageLayout.from_config(config).runs_dir("sigkill"))
    # Killed two batches after the mid-epoch checkpoint at batch 5 of epoch 2 was registered.
    after = {"snapshot": str(snapshot / "train" / "checkpoint_manager_snapshot.json")}
    after |= {"epoch_in_progress": 2, "batch": every_n}
    fault_dir = _inject(
        monkeypatch,
        tmp_path,
        kind="sigkill",
        rank=1,
        epoch=2,
        batch=every_n + 2,
        after_checkpoint=after,
    )
    monkeypatch.setattr(
        train_stage, "train_final", functools.partial(train_final, train_fn=_faulty_worker)
    )
    tracker = store.configure(config)
    parent = tracker.start_parent_run("sigkill-run")

    killer = _kill_when_ready(fault_dir)
    trained = stages.train.fn(config, manifest, "sigkill", parent)
    outcome, train_run = trained.outcome, trained.run_id
    killer.join(timeout=1)

    killed_pid = int((fault_dir / "killed").read_text())
    assert killed_pid == int((fault_dir / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(killed_pid, 0)  # the worker process really is gone
    assert [row["epoch"] for row in outcome.history] == [1, 2]

    # Case 6: in the epoch that was cut, attempt 1 up to the resume position plus attempt 2
    # trained on every training sample exactly once.
    seen = [row for row in _seen(fault_dir) if row["epoch"] == 2]
    resumed_at = min(row["batch"] for row in seen if not row["first"]) - 1
    assert resumed_at == every_n  # from the mid-epoch checkpoint
    counted = Counter(
        sample
        for row in seen
        if not row["first"] or row["batch"] <= resumed_at
        for sample in row["ids"]
    )
    assert set(counted.values()) == {1}, counted.most_common(3)
    assert len(counted) == manifest.rows["train"]
    # The order is deterministic: a batch attempt 1 trained past the checkpoint comes again,
    # identical, in attempt 2 (its update was lost with the killed attempt).
    lost = {(r["batch"], tuple(r["ids"])) for r in seen if r["first"] and r["batch"] > resumed_at}
    again = {(r["batch"], tuple(r["ids"])) for r in seen if not r["first"]}
    assert lost and lost <= again

    # Case 1: one MLflow training run, each epoch logged once at steps 1..E.
    runs = [r for r in tracker.find_runs(parent) if r.info.run_name == "train"]
    assert [r.info.run_id for r in runs] == [train_run]
    assert runs[0].info.status == "FINISHED"
    steps = [m.step for m in tracker.client.get_metric_history(train_run, "val_accuracy")]
    assert steps == [1, 2]


def test_sigkilled_worker_without_restarts_fails_fast(manifest, layout, tmp_path, monkeypatch):
    fault_dir = _inject(monkeypatch, tmp_path, kind="sigkill", rank=1, epoch=1, batch=2)
    killer = _kill_when_ready(fault_dir)
    started = time.monotonic()
    with pytest.raises(WorkerFailedError, match=r"train.max_failures=0") as raised:
        train_final(
            _config("train.max_failures=0", "train.max_epochs=1"),
            manifest,
            "sigkill-no-retry",
            layout,
            train_fn=_faulty_worker,
        )
    killer.join(timeout=1)
    assert (fault_dir / "killed").exists()
    assert "rank 1: " in str(raised.value)  # the killed rank is named
    # Fails once the kill is seen (no restart, no hang): far below the worker's 300 s wait.
    assert time.monotonic() - started < 200
    assert not [row for row in _seen(fault_dir) if not row["first"]]  # no second attempt


# -- case 2: an exception in one rank, first attempt only ------------------------------------------


def test_exception_in_one_rank_is_recovered(manifest, layout, tmp_path, monkeypatch):
    fault_dir = _inject(monkeypatch, tmp_path, kind="raise", rank=1, epoch=2, batch=3)
    outcome = train_final(
        # Streamed every epoch (no shard cache): the other cases resume over the in-memory shard.
        _config("train.max_failures=1", "train.shard_cache_mb=0"),
        manifest,
        "raise-once",
        layout,
        train_fn=_faulty_worker,
    )
    assert (fault_dir / "fired").exists()
    assert [row["epoch"] for row in outcome.history] == [1, 2]
    # The restart resumed at epoch 2 (the epoch-end checkpoint), not from scratch.
    retried = [row for row in _seen(fault_dir) if not row["first"]]
    assert retried and {row["epoch"] for row in retried} == {2}
    assert load_state(outcome.checkpoint_path)["epoch"] in (1, 2)


# -- case 14: a hung rank is detected by the collective timeout, retried, finished --------------


@pytest.mark.slow
def test_hung_rank_times_out_and_the_retry_finishes(manifest, layout, tmp_path, monkeypatch):
    # The timeout bounds every collective of both attempts, not only the hung one: at 10 s a
    # healthy retry's rank stalled by a loaded CI machine timed out too (CI, stop 24). 30 s is
    # still two orders below the hang, so only the timeout can end the first attempt.
    timeout_s = 30
    fault_dir = _inject(monkeypatch, tmp_path, kind="hang", rank=1, epoch=1, batch=2)
    started = time.monotonic()
    outcome = train_final(
        _config("train.max_failures=1", "train.max_epochs=1", f"train.timeout_s={timeout_s}"),
        manifest,
        "hang-once",
        layout,
        train_fn=_faulty_worker,
    )
    elapsed = time.monotonic() - started
    assert (fault_dir / "fired").exists()
    assert [row["epoch"] for row in outcome.history] == [1]
    assert [row for row in _seen(fault_dir) if not row["first"]], "no second attempt ran"
    # The hung rank sleeps for an hour: only the timeout can have ended the first attempt.
    assert elapsed < 300, elapsed


# -- case 4: the disk fills while a checkpoint is written ------------------------------------------


class QuotaHandler(pafs.FSSpecHandler):
    """A local filesystem whose checkpoint files share ``quota_bytes``: a write past it raises
    ENOSPC, like a full disk (usage is read from disk, so every Ray process sees one quota)."""

    def __init__(self, root: str, quota_bytes: int):
        super().__init__(LocalFileSystem(auto_mkdir=True))
        self.quota_root, self.quota_bytes = root, quota_bytes

    def open_output_stream(self, path, metadata):
        if "/checkpoint_" not in path:
            return super().open_output_stream(path, metadata)
        return pa.PythonFile(_QuotaFile(self.fs.open(path, mode="wb"), self, path), mode="w")

    def used_bytes(self, excluding: str) -> int:
        return sum(
            os.path.getsize(os.path.join(folder, name))
            for folder, _, names in os.walk(self.quota_root)
            if "/checkpoint_" in folder
            for name in names
            if os.path.join(folder, name) != excluding
        )


class _QuotaFile:
    def __init__(self, inner, handler: QuotaHandler, path: str):
        self._inner, self._handler, self._path, self._written = inner, handler, path, 0

    def write(self, data):
        used = self._handler.used_bytes(self._path) + self._written
        if used + len(data) > self._handler.quota_bytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        self._written += len(data)
        return self._inner.write(data)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _checkpoint_size(config, manifest) -> int:
    """Bytes of one checkpoint of this model (weights, AdamW moments and the feature spec it
    carries, drift reference included), as the loop saves it."""
    from training.model.networks import build_model

    spec = manifest.spec
    model = build_model(config.model, spec.input_shape, spec.num_classes)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(2, spec.num_features)).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "spec": spec.to_dict(), "model_config": config.model.model_dump()}, buffer)
    return buffer.tell()


@pytest.mark.slow
def test_disk_full_while_checkpointing_keeps_earlier_checkpoints(
    manifest, layout, tmp_path, monkeypatch
):
    config = _config("train.max_failures=1", "train.max_epochs=4", "train.checkpoint.num_to_keep=4")
    root = str(tmp_path / "full-disk")
    os.makedirs(root)
    # Room for two checkpoints and a half: the third write runs out of space.
    quota = int(2.5 * _checkpoint_size(config, manifest))
    storage = pafs.PyFileSystem(QuotaHandler(root, quota))
    monkeypatch.setattr(
        StorageLayout, "ray_storage", lambda self, run_id: (f"{root}/{run_id}", storage)
    )

    with pytest.raises(StorageError, match="disk full") as raised:
        train_final(config, manifest, "disk-full", layout)
    assert root in str(raised.value) and "storage.root" in str(raised.value)

    run_dir = Path(root) / "disk-full" / "train"
    snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    kept = [r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]]
    latest = snapshot["latest_checkpoint_result"]["checkpoint_dir_name"]
    # Only complete checkpoints are known to Ray: epochs 1 and 2, each loadable.
    assert latest in kept
    assert sorted(load_state(str(run_dir / name))["epoch"] for name in kept) == [1, 2]
    assert load_state(str(run_dir / latest))["epoch"] == 2
    # The half-written checkpoint(s) of epoch 3 exist on disk but are neither latest nor kept.
    partial = [p.name for p in run_dir.glob("checkpoint_*") if p.name not in kept]
    assert partial, "the fault never hit a checkpoint write"


# -- case 5: a diverging trial in a sweep --------------------------------------------------------


def test_diverging_trial_errors_with_its_reason_and_never_wins(manifest, layout):
    from training.tune.sweep import run_sweep

    config = load_config(
        None,
        [
            "sweep.num_samples=4",
            "sweep.max_concurrent_trials=2",
            "sweep.asha.max_t=2",
            "sweep.asha.grace_period=1",
            "sweep.asha.reduction_factor=2",
            "train.lr_schedule=constant",
            # lr=1e6 makes the loss inf/NaN in the first epoch; 3e-3 trains normally.
            "sweep.search_space={train.lr: {choice: [1.0e+6, 3.0e-3]}}",
        ],
    )
    outcome = run_sweep(config, manifest, "sweep-diverge", layout)
    diverged = [t for t in outcome.trials if t.params["train.lr"] == 1.0e6]
    healthy = [t for t in outcome.trials if t.params["train.lr"] == 3.0e-3]
    assert diverged and healthy, [t.params for t in outcome.trials]
    for trial in diverged:
        assert trial.status == "errored"
        assert "training diverged" in trial.error and "lower train.lr" in trial.error
        assert "val_accuracy" not in trial.metrics
    assert all(t.status != "errored" and t.metrics["val_accuracy"] > 0.5 for t in healthy)
    assert outcome.best_trial_id in {t.trial_id for t in healthy}
    assert outcome.best_params == {"train.lr": 3.0e-3}
