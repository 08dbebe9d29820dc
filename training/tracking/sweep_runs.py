"""A sweep's runs: one child run per Tune trial while it runs, and its trials read back after
(what `trainflow compare` shows)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from training.errors import TrainflowError
from training.metrics import direction
from training.platform.secrets import redact
from training.tracking.runs import PARENT_TAG, RUN_ID_TAG, STAGE_TAG, Tracker, filter_literal

if TYPE_CHECKING:
    from mlflow.entities import Run

# Tune's bookkeeping in each trial result: not worth a metric on every trial run.
TUNE_BOOKKEEPING = {
    "timestamp",
    "should_checkpoint",
    "done",
    "pid",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "trial_id",
    "date",
    "hostname",
    "node_ip",
}


def tune_callback(tracker: Tracker, sweep_run_id: str):
    """A Tune callback that writes one child run per trial under ``sweep_run_id``, ended
    FINISHED (or FAILED) with the trial."""
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    tags = {PARENT_TAG: sweep_run_id, STAGE_TAG: "trial"}
    run_tag = tracker.client.get_run(sweep_run_id).data.tags.get(RUN_ID_TAG)
    if run_tag:
        tags[RUN_ID_TAG] = run_tag

    class TrialMetricsCallback(MLflowLoggerCallback):
        """Logs the loop's metrics (train_loss, val_loss, val_accuracy, ...) with
        step=training_iteration, without Tune's bookkeeping (pid, timestamp, done,
        config/...), so the compare view lists what matters."""

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            kept = {
                key: value
                for key, value in result.items()
                if key not in TUNE_BOOKKEEPING and not str(key).startswith("config")
            }
            super().log_trial_result(iteration, trial, kept)

    return TrialMetricsCallback(
        tracking_uri=tracker.tracking_uri,
        experiment_name=tracker.config.mlflow.experiment,
        tags=tags,
        save_artifact=False,
    )


def recent_pipeline_runs(tracker: Tracker, limit: int = 5) -> list[dict[str, Any]]:
    """The latest pipeline (parent) runs of the experiment, newest first."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.`{STAGE_TAG}` = 'pipeline'",
        max_results=limit,
        order_by=["attributes.start_time DESC"],
    )
    return [
        {"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status} for r in runs
    ]


def sweep_trials(tracker: Tracker, run_id: str | None = None) -> dict[str, Any]:
    """One sweep and its trial runs as plain dicts (what `trainflow compare` shows).

    ``run_id``: a pipeline (parent) run, its sweep run or one of its trial runs; None: the
    latest sweep of the experiment. Each trial carries its name, params, last ``metrics``,
    ``best_value`` (best of the sweep metric over its epochs), ``epochs`` and fate tags.
    """
    client = tracker.client
    sweep = _sweep_run(tracker, run_id)
    metric = sweep.data.params.get("metric") or tracker.config.sweep.metric
    mode = direction(metric)
    parent_id = sweep.data.tags.get(PARENT_TAG)
    experiment = client.get_experiment(sweep.info.experiment_id)
    children = tracker.search(
        f"tags.`{PARENT_TAG}` = {filter_literal(sweep.info.run_id)}", [sweep.info.experiment_id]
    )
    trials = []
    for run in children:
        history = client.get_metric_history(run.info.run_id, metric)
        values = [m.value for m in history if math.isfinite(m.value)]
        tags = run.data.tags
        trials.append(
            {
                "run_id": run.info.run_id,
                "name": run.info.run_name,
                "status": run.info.status,
                "trial_id": tags.get("trainflow.trial_id") or tags.get("trial_name", ""),
                "params": dict(run.data.params),
                "metrics": dict(run.data.metrics),
                "best_value": (max if mode == "max" else min)(values) if values else None,
                "epochs": max((m.step for m in history), default=0),
                "fate": tags.get("trainflow.fate", ""),
                "fate_detail": tags.get("trainflow.fate_detail") or tags.get("trainflow.fate", ""),
                "best": tags.get("trainflow.best") == "true",
            }
        )
    return {
        "tracking_uri": redact(tracker.tracking_uri),
        "experiment_id": sweep.info.experiment_id,
        "experiment": experiment.name,
        "parent_run_id": parent_id,
        "parent_run_name": client.get_run(parent_id).info.run_name if parent_id else None,
        "sweep_run_id": sweep.info.run_id,
        "metric": metric,
        "mode": mode,
        "max_t": sweep.data.params.get("asha.max_t"),
        "trials": trials,
    }


def _sweep_run(tracker: Tracker, run_id: str | None) -> Run:
    """The sweep run of ``run_id`` (see :func:`sweep_trials`), or the experiment's latest."""
    from mlflow.exceptions import MlflowException

    client, where = tracker.client, redact(tracker.tracking_uri)
    if run_id is None:
        found = client.search_runs(
            [tracker.experiment_id],
            filter_string=f"tags.`{STAGE_TAG}` = 'sweep'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        if not found:
            raise TrainflowError(
                f"experiment {tracker.config.mlflow.experiment!r} in {where} has no sweep yet "
                f"(run `trainflow run`); {_where_to_look(tracker)}"
            )
        return found[0]
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise TrainflowError(f"no run {run_id!r} in {where}; {_where_to_look(tracker)}") from None
    stage = run.data.tags.get(STAGE_TAG)
    if stage == "sweep":
        return run
    if stage == "trial" and PARENT_TAG in run.data.tags:
        return client.get_run(run.data.tags[PARENT_TAG])
    sweeps = client.search_runs(
        [run.info.experiment_id],
        filter_string=(
            f"tags.`{PARENT_TAG}` = {filter_literal(run_id)} and tags.`{STAGE_TAG}` = 'sweep'"
        ),
        max_results=1,
    )
    if not sweeps:
        raise TrainflowError(
            f"run {run_id!r} ({run.info.run_name}) has no sweep (was sweep.enabled false?); "
            f"{_where_to_look(tracker)}"
        )
    return sweeps[0]


def _where_to_look(tracker: Tracker) -> str:
    recent = recent_pipeline_runs(tracker)
    listing = ", ".join(f"{r['name']} ({r['run_id']})" for r in recent) or "none"
    return (
        f"pipeline runs of experiment {tracker.config.mlflow.experiment!r}, newest first: "
        f"{listing}; list them all with `mlflow runs list --experiment-id "
        f"{tracker.experiment_id}` (MLFLOW_TRACKING_URI={redact(tracker.tracking_uri)})"
    )
