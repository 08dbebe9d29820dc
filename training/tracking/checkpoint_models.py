"""Every checkpoint the final training keeps, as an MLflow logged model of trainflow's flavour
(``mlflow.log_checkpoints``): the Models tab lists each epoch Ray Train kept, with the metrics
that epoch was kept by, and any of them loads as ``models:/<model id>``.

Each is the model the registered version is (``flavour.model_kwargs``, ``model_files``), named
``<registered model>-epoch-<N>``, logged under the train run at ``step=N``, its ``train_*`` and
``val_*`` at epoch N linked to it and to the split's dataset (``model_evidence``). The model is
created first and its files logged to it outside a run, and the train run's output and metric
links follow: ``log_model(step=N)`` under the run would link the epoch's metrics itself, without
their datasets, and MLflow refuses the same point linked again with one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from training.config import registered_model_name
from training.tracking import flavour, model_evidence, model_files
from training.tracking.store import global_uris

if TYPE_CHECKING:
    import pandas as pd

    from training.manifest import Manifest
    from training.tracking.runs import Tracker

#: Tags on each checkpoint's logged model: the checkpoint it was made from, and its epoch.
CHECKPOINT_TAG = "trainflow.checkpoint_path"
EPOCH_TAG = "trainflow.epoch"


@dataclass(frozen=True)
class CheckpointModel:
    """A kept checkpoint and the logged model made from it."""

    epoch: int
    checkpoint_path: str
    model_id: str

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_id}"


def model_name(registered: str, epoch: int) -> str:
    """The logged model's name: the registered model's, with the checkpoint's epoch."""
    return f"{registered}-epoch-{epoch}"


def by_epoch(kept: list[tuple[str, dict[str, Any]]], best: str | None) -> list[tuple[int, str]]:
    """(epoch, path) of each kept checkpoint, by epoch; one without an epoch is left out (a
    user's function that numbers no epochs). Of two with the same epoch (checkpoints within an
    epoch, ``train.checkpoint.every_n_batches``) the ``best`` one, else the first listed."""
    epochs: dict[int, str] = {}
    for path, metrics in kept:
        if metrics.get("epoch") is None:
            continue
        epoch = int(metrics["epoch"])
        if epoch not in epochs or path == best:
            epochs[epoch] = path
    return sorted(epochs.items())


def log_checkpoint_models(
    tracker: Tracker,
    run_id: str,
    manifest: Manifest,
    kept: list[tuple[str, dict[str, Any]]],
    load_state: Callable[[str], dict[str, Any]],
    raw_rows: pd.DataFrame | None,
    best: str | None = None,
) -> list[CheckpointModel]:
    """Log each kept checkpoint (``kept``: Ray Train's (path, metrics); ``best``: the best
    one's path) as a logged model under the train run ``run_id``; ``load_state`` reads a
    checkpoint's state. A model logged before from the same run and checkpoint (a retried
    task) is kept, not logged again."""
    registered = registered_model_name(tracker.config)
    earlier = _logged_before(tracker, run_id)
    params = {key: str(value) for key, value in tracker.client.get_run(run_id).data.params.items()}
    models = []
    for epoch, path in by_epoch(kept, best):
        model_id = earlier.get((model_name(registered, epoch), path))
        if model_id is None:
            state = {k: v for k, v in load_state(path).items() if k != "optimizer"}
            model_id = _log_one(tracker, run_id, registered, epoch, path, state, raw_rows, params)
        model_evidence.link_run_metrics(
            tracker,
            run_id,
            model_id,
            manifest,
            model_evidence.split_of_training_metric,
            step=epoch,
        )
        models.append(CheckpointModel(epoch, path, model_id))
    return models


def _logged_before(tracker: Tracker, run_id: str) -> dict[tuple[str, str], str]:
    """The ready logged models of ``run_id`` by (name, checkpoint path)."""
    from mlflow.entities import LoggedModelStatus

    found = tracker.client.search_logged_models(
        experiment_ids=[tracker.experiment_id],
        filter_string=f"source_run_id = '{run_id}'",
    )
    return {
        (model.name, model.tags[CHECKPOINT_TAG]): model.model_id
        for model in found
        if CHECKPOINT_TAG in model.tags and model.status == LoggedModelStatus.READY
    }


def _log_one(
    tracker: Tracker,
    run_id: str,
    registered: str,
    epoch: int,
    path: str,
    state: dict[str, Any],
    raw_rows: pd.DataFrame | None,
    params: dict[str, str],
) -> str:
    """One checkpoint's logged model: created with the run's ``params``, its files logged as
    the registered version's are, then the run's output at ``step=epoch``; returns its id."""
    from mlflow.entities import LoggedModelOutput

    from training.loop.checkpoint import save_state

    client = tracker.client
    model = client.create_logged_model(
        experiment_id=tracker.experiment_id,
        name=model_name(registered, epoch),
        source_run_id=run_id,
        params=params,
        tags={
            CHECKPOINT_TAG: path,
            EPOCH_TAG: str(epoch),
            model_evidence.DESCRIPTION_TAG: f"{registered}: the checkpoint of epoch {epoch}",
        },
    )
    with tempfile.TemporaryDirectory() as tmp, global_uris(tracker.tracking_uri):
        state_path = save_state(state, tmp)
        kwargs = flavour.model_kwargs(state_path, state["spec"], raw_rows, tmp)
        # No run is active: the model's files only (MLflow finalizes it as READY).
        model_files.log_model(model.name, model_id=model.model_id, **kwargs)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=epoch)])
    return model.model_id
