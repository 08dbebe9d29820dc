"""Stage 3: the final DDP training (Ray Train) with the chosen configuration, under one MLflow
run: the model's source run."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from training.config import PipelineConfig
from training.loop.records import log_loop_records
from training.loop.trainer import TrainOutcome, train_final
from training.manifest import Manifest
from training.report.plots import learning_curves_png
from training.stages.connect import connect_ray
from training.storage import StorageLayout
from training.tracking import lineage, store, system_metrics
from training.tracking.system_metrics import SystemMetricsTarget


@dataclass(frozen=True)
class Trained:
    """The training's outcome (history, best checkpoint) and its MLflow run id."""

    outcome: TrainOutcome
    run_id: str


def train(config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str) -> Trained:
    """Train; log params, the history (each epoch as it is checkpointed), the checkpoint's path
    and the learning curves."""
    connect_ray(config)
    tracker = store.configure(config)
    train_run = tracker.start_child_run(parent_run, "train", stage="train")
    lineage.log_datasets(tracker, train_run, manifest, ["train", "val"])
    tracker.log_params(
        train_run,
        {
            **{k: v for k, v in config.flat().items() if k.startswith(("train.", "model."))},
            "task": manifest.spec.task,
        },
    )
    # Each epoch in MLflow while training goes on; the end logs what is not there yet.
    outcome = train_final(
        config,
        manifest,
        run_id,
        StorageLayout.from_config(config),
        on_epochs=tracker.history_sink(train_run, step_key="epoch"),
        epochs_done=tracker.last_step(train_run, config.train.checkpoint.score_attribute),
        wrap_worker=system_metrics.sampling(
            SystemMetricsTarget.of(
                train_run, tracker.tracking_uri, config.mlflow.system_metrics_interval_s
            )
        ),
    )
    tracker.log_history(train_run, outcome.history, step_key="epoch")
    log_loop_records(tracker, train_run, outcome)  # train.eval_every_steps, train.profile
    tracker.set_tags(train_run, {"checkpoint_path": outcome.checkpoint_path})
    with tempfile.TemporaryDirectory() as tmp:
        curves = learning_curves_png(outcome.history, os.path.join(tmp, "curves.png"))
        tracker.log_artifact(train_run, curves, "plots")
    tracker.end_run(train_run)
    return Trained(outcome, train_run)
