"""A sweep's runs: one child run per Tune trial while it runs, and its trials read back after
(what `trainflow compare` shows)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from training.errors import TrainflowError
from training.metrics import direction
from training.platform.secrets import redact
from training.tracking.runs import (
    PARENT_TAG,
    STAGE_TAG,
    Tracker,
    filter_literal,
    inherited_tags,
)
from training.tune.trials import trial_run_name

if TYPE_CHECKING:
    from mlflow.entities import Run

TRIAL_ID_TAG = "trainflow.trial_id"

# The model's own metrics in a trial's result (train_loss, val_loss, val_accuracy, val_rmse ...);
# everything else there is Tune's bookkeeping (training_iteration, time_*_s, pid, timestamp, done)
# or the loop's (epoch is the step, workers, lr is the trial's param), kept in Tune's own files:
# as metrics they sorted ahead of val_accuracy in every compare view. The epoch's throughput
# (train_rows_per_s or train_tokens_per_s, and data_wait_share) is kept: a slow trial shows why.
MODEL_METRIC_PREFIXES = ("train_", "val_", "data_wait_share")


def model_metrics(result: dict[str, Any], first: str | None = None) -> dict[str, float]:
    """The model's metrics in one Tune result: numbers named ``train_*`` / ``val_*``, the
    metric ``first`` ahead of the others. MLflow's compare view plots a run's metrics in the
    order they were first logged, opening on the first: the sweep's metric."""
    metrics = {
        key: value
        for key, value in result.items()
        if str(key).startswith(MODEL_METRIC_PREFIXES)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    }
    return dict(sorted(metrics.items(), key=lambda item: item[0] != first))


def trial_step(result: dict[str, Any], counted: bool = False) -> int | None:
    """A result's step: its epoch. None for a mid-epoch checkpoint's report (no epoch done).
    ``counted``: a user's function or LightningModule (``train.engine: function``,
    ``lightning``: Lightning reports its own 0-based epoch), whose reports are its epochs,
    numbered by Tune (``training_iteration``) as the train run numbers them, whatever keys the
    function reports."""
    epoch = result.get("training_iteration" if counted else "epoch")
    return int(epoch) if epoch is not None else None


def tune_callback(tracker: Tracker, sweep_run_id: str):
    """A Tune callback that writes one child run per trial under ``sweep_run_id``, ended
    FINISHED (or FAILED) with the trial."""
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    sweep_tags = tracker.client.get_run(sweep_run_id).data.tags
    tags = {**inherited_tags(sweep_tags), PARENT_TAG: sweep_run_id, STAGE_TAG: "trial"}
    sweep_metric = tracker.config.sweep.metric
    counted = tracker.config.train.epochs_from_reports

    class TrialMetricsCallback(MLflowLoggerCallback):
        """One run per trial: named "trial NN" (the sweep stage renames it with its values once
        the sweep is over), tagged with the trial's id, its sampled values as params, and the
        model's metrics per epoch (step = epoch)."""

        def log_trial_start(self, trial) -> None:
            if trial not in self._trial_runs:
                run = self.mlflow_util.start_run(
                    tags={**self.tags, TRIAL_ID_TAG: trial.trial_id},
                    run_name=trial_run_name(trial.trial_id, {}),
                )
                self._trial_runs[trial] = run.info.run_id
            params = {key: _param_value(value) for key, value in trial.config.items()}
            self.mlflow_util.log_params(run_id=self._trial_runs[trial], params_to_log=params)

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            step = trial_step(result, counted)
            metrics = model_metrics(result, sweep_metric)
            if step is None or not metrics:
                return
            self.mlflow_util.log_metrics(
                run_id=self._trial_runs[trial], metrics_to_log=metrics, step=step
            )

    return TrialMetricsCallback(
        tracking_uri=tracker.tracking_uri,
        experiment_name=tracker.config.mlflow.experiment,
        tags=tags,
        save_artifact=False,
    )


def _param_value(value: Any) -> Any:
    """A sampled value as a param: lists as JSON ([128, 64]), numbers and strings as they are."""
    return json.dumps(value) if isinstance(value, list | tuple | dict) else value


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
                "trial_id": tags.get(TRIAL_ID_TAG) or tags.get("trial_name", ""),
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
