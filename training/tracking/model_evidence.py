"""The evidence on a logged model's page in the MLflow UI: the metrics it was measured with,
each linked to the split's dataset ("Datasets used") and to the run that measured it ("Runs").

The evaluate run's test metrics go to the test split; the train run's ``val_*`` and ``train_*``
at the checkpoint's epoch to the validation and training splits; and the evaluate run takes the
model as its input. The points are those the runs already hold, logged again with the model's
id and the dataset: MLflow keeps one copy of a point that is logged twice (its own
``log_model`` links the source run's metrics the same way), so the runs' histories stay as
they were. The model's description is its registered version's (with links to its runs).
"""

from __future__ import annotations

from collections.abc import Callable

from training.manifest import Manifest
from training.tracking import lineage
from training.tracking.runs import MAX_METRICS_PER_BATCH, Tracker

#: The tag MLflow's UI shows as a logged model's (or a run's) description.
DESCRIPTION_TAG = "mlflow.note.content"
#: A training run's metrics by the split they were measured on; others (lr, workers) are not
#: evidence about the model.
SPLIT_OF_PREFIX = {"train_": "train", "val_": "val"}


def split_of_training_metric(key: str) -> str | None:
    """The split a train run's metric was measured on, or None (not a model metric)."""
    return next(
        (split for prefix, split in SPLIT_OF_PREFIX.items() if key.startswith(prefix)), None
    )


def link_run_metrics(
    tracker: Tracker,
    run_id: str,
    model_id: str,
    manifest: Manifest,
    split_of: Callable[[str], str | None],
    step: int | None = None,
) -> list[str]:
    """Link ``run_id``'s metrics (their points at ``step``; None: each one's latest) to the
    logged model ``model_id`` and to the dataset of the split ``split_of(key)`` names; returns
    the keys linked."""
    from mlflow.entities import Metric

    linked = []
    for key in sorted(tracker.client.get_run(run_id).data.metrics):
        split = split_of(key)
        if split is None:
            continue
        history = tracker.client.get_metric_history(run_id, key)
        points = [point for point in history if step is None or point.step == step]
        if not points:
            continue
        point = max(points, key=lambda p: (p.step, p.timestamp))
        linked.append(
            Metric(
                key,
                point.value,
                point.timestamp,
                point.step,
                model_id=model_id,
                dataset_name=lineage.dataset_name(manifest, split),
                dataset_digest=manifest.fingerprint,
                run_id=run_id,
            )
        )
    for start in range(0, len(linked), MAX_METRICS_PER_BATCH):
        tracker.client.log_batch(run_id, metrics=linked[start : start + MAX_METRICS_PER_BATCH])
    return [metric.key for metric in linked]


def link_evidence(
    tracker: Tracker,
    model_id: str,
    manifest: Manifest,
    train_run: str,
    checkpoint_epoch: int | None,
    eval_run: str | None,
) -> None:
    """The logged model's evidence: the evaluate run's test metrics (and the model as that
    run's input), the train run's metrics at the checkpoint's epoch."""
    from mlflow.entities import LoggedModelInput

    step = int(checkpoint_epoch) if checkpoint_epoch is not None else None
    link_run_metrics(tracker, train_run, model_id, manifest, split_of_training_metric, step)
    if eval_run:
        tracker.client.log_inputs(eval_run, models=[LoggedModelInput(model_id)])
        link_run_metrics(tracker, eval_run, model_id, manifest, lambda key: "test")


def describe(tracker: Tracker, model_id: str, text: str) -> None:
    """The logged model's description on its page (Markdown, as the version's)."""
    tracker.client.set_logged_model_tags(model_id, {DESCRIPTION_TAG: text})
