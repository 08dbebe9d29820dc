"""Stage 3: the final DDP training (Ray Train) with the chosen configuration, under one MLflow
run: the model's source run."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

from training.config import PipelineConfig
from training.data.splits import raw_rows
from training.loop.records import log_loop_records
from training.loop.trainer import TrainOutcome, train_final
from training.manifest import Manifest
from training.report.plots import learning_curves_png
from training.stages.connect import connect_ray
from training.stages.evaluated import load_checkpoint_state
from training.storage import StorageLayout
from training.tracking import (
    checkpoint_models,
    flavour,
    lineage,
    outage_record,
    store,
    system_metrics,
)
from training.tracking.runs import Tracker
from training.tracking.system_metrics import SystemMetricsTarget


@dataclass(frozen=True)
class Trained:
    """The training's outcome (history, best checkpoint), its MLflow run id and the logged
    model of each kept checkpoint by its path (``mlflow.log_checkpoints``)."""

    outcome: TrainOutcome
    run_id: str
    checkpoint_models: dict[str, str] = field(default_factory=dict)


def train(config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str) -> Trained:
    """Train; log params, the history (each epoch as it is checkpointed), the checkpoint's path,
    the learning curves and each kept checkpoint as a logged model."""
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
        on_epochs=outage_record.watched(
            tracker.history_sink(train_run, step_key="epoch"),
            tracker.tracking_uri,
            "the training's epoch rows",
        ),
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
    models = _log_checkpoints(config, manifest, tracker, train_run, outcome)
    tracker.end_run(train_run)
    return Trained(outcome, train_run, models)


def _log_checkpoints(
    config: PipelineConfig,
    manifest: Manifest,
    tracker: Tracker,
    train_run: str,
    outcome: TrainOutcome,
) -> dict[str, str]:
    """Each checkpoint Ray Train kept as a logged model under the train run (the test split's
    first rows its input example, as the registered version's); {path: model id}."""
    if not config.mlflow.log_checkpoints or not outcome.kept_checkpoints:
        return {}
    example = raw_rows(manifest, "test", flavour.EXAMPLE_ROWS, config.storage.endpoint_url)
    models = checkpoint_models.log_checkpoint_models(
        tracker,
        train_run,
        manifest,
        outcome.kept_checkpoints,
        lambda path: load_checkpoint_state(config, path, manifest.spec),
        example,
        best=outcome.checkpoint_path,
    )
    return {model.checkpoint_path: model.model_id for model in models}
