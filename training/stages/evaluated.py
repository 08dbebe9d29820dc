"""What the evaluate stage hands on (the promote stage and the gate read it), and the one way a
stage loads a checkpoint's state: shared by the evaluation of every task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from training.config import PipelineConfig
from training.inference.evaluate import EvalResult
from training.manifest import FeatureSpec


@dataclass
class Evaluated:
    """The test metrics and report, and what promote logs: the model's state (weights, spec,
    model config; no optimizer) and a few raw test rows (its input example); for the gate, the
    test split's raw rows with the true labels and the model's predictions in the same order
    (None when the split is too large to hold in the driver); the evaluate run (the logged
    model's test metrics link to it)."""

    result: EvalResult
    state: dict[str, Any]
    example: pd.DataFrame
    test_rows: pd.DataFrame | None = None
    labels: np.ndarray | None = None
    predictions: np.ndarray | None = None
    run_id: str | None = None


def load_checkpoint_state(
    config: PipelineConfig, checkpoint_path: str, spec: FeatureSpec | None = None
) -> dict[str, Any]:
    """A checkpoint's state (local or remote storage), loaded with ``weights_only``; a user
    function's or LightningModule's checkpoint (``train.engine: function``, ``lightning``)
    becomes the same state (with the data's ``spec``)."""
    from ray.train import Checkpoint

    from training.loop.checkpoint import load_model_state
    from training.storage import filesystem, is_remote

    fs, path = filesystem(checkpoint_path, config.storage.endpoint_url)
    remote = is_remote(checkpoint_path)
    checkpoint = Checkpoint(path if remote else checkpoint_path, filesystem=fs if remote else None)
    with checkpoint.as_directory() as directory:
        if config.train.epochs_from_reports and spec is not None:
            from training.loop.function_checkpoint import user_checkpoint_state

            return user_checkpoint_state(directory, config, spec)
        return load_model_state(directory)


def open_evaluation(
    config: PipelineConfig, manifest, checkpoint_path: str, parent_run: str
) -> tuple[Any, str, dict[str, Any]]:
    """(tracker, the evaluate run, the checkpoint's state without its optimizer): how every
    task's evaluation starts."""
    from training.tracking import lineage, store

    tracker = store.configure(config)
    eval_run = tracker.start_child_run(parent_run, "evaluate", stage="evaluate")
    tracker.set_tags(eval_run, {"checkpoint_path": checkpoint_path})
    lineage.log_datasets(tracker, eval_run, manifest, ["test"])
    checkpoint = load_checkpoint_state(config, checkpoint_path, manifest.spec)
    return tracker, eval_run, {k: v for k, v in checkpoint.items() if k != "optimizer"}
