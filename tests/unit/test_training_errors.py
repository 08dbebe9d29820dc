"""What a fit that Ray Train gave up on turns into (no Ray cluster needed)."""

from __future__ import annotations

import errno

import pytest
from ray.train import ControllerError, WorkerGroupError

from training.config.overrides import load_config
from training.errors import (
    StorageError,
    TrainingDivergedError,
    UnsafeCheckpointError,
    WorkerFailedError,
    is_retriable,
)
from training.loop.failures import training_error

CONFIG = load_config(None, ["train.max_failures=2"])


def test_our_own_error_from_a_worker_is_raised_as_is():
    diverged = TrainingDivergedError("training diverged at epoch 1; lower train.lr")
    error = WorkerGroupError("rank 1 failed", {0: RuntimeError("peer gone"), 1: diverged})
    assert training_error(error, CONFIG, "/runs/x") is diverged


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_anywhere_becomes_a_storage_error_naming_path_and_fix(code):
    full = OSError(code, "no room", "/runs/x/train/checkpoint_1/state.pt")
    for error in (WorkerGroupError("upload failed", {0: full}), ControllerError(full)):
        mapped = training_error(error, CONFIG, "/runs/x")
        assert isinstance(mapped, StorageError)
        assert "disk full" in str(mapped) and "/runs/x" in str(mapped)
        assert "storage.root" in str(mapped) and not is_retriable(mapped)


def test_other_failures_name_each_rank_and_max_failures():
    error = WorkerGroupError(
        "two ranks failed",
        {1: RuntimeError("The actor is dead. More text"), 0: RuntimeError("x" * 400)},
    )
    mapped = training_error(error, CONFIG, "/runs/x")
    assert isinstance(mapped, WorkerFailedError) and is_retriable(mapped)
    text = str(mapped)
    assert "train.max_failures=2" in text
    assert "rank 0: " + "x" * 150 + "…" in text and "rank 1: The actor is dead;" in text
    assert "More text" not in text


def test_an_unsafe_checkpoint_is_never_retried():
    assert not is_retriable(UnsafeCheckpointError("refused"))
