"""Stage 2: the ASHA sweep (Ray Tune) under one MLflow run, a child run per trial, each trial's
run named and tagged with how it ended."""

from __future__ import annotations

import json
import tempfile
from typing import Any

from training.config import PipelineConfig
from training.manifest import Manifest
from training.report.sweep_plots import sweep_plots
from training.stages.connect import connect_ray
from training.storage import StorageLayout
from training.tracking import lineage, store, sweep_runs
from training.tracking.runs import Tracker
from training.tune.outcome import SweepOutcome
from training.tune.resources import drives_trainer
from training.tune.sweep import run_sweep, sample_sizes
from training.tune.trials import TrialRow, sweep_saving, trial_rows


def sweep(config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str) -> SweepOutcome:
    """Run the sweep; log its settings, counts, best trial, summary and plots to the sweep run."""
    connect_ray(config)
    tracker = store.configure(config)
    sweep_run = tracker.start_child_run(parent_run, "sweep", stage="sweep")
    lineage.log_datasets(tracker, sweep_run, manifest, ["train", "val"])
    tracker.log_params(sweep_run, _settings(config, manifest))
    tracker.log_dict(sweep_run, search_space(config), "search_space.json")
    outcome = run_sweep(
        config,
        manifest,
        run_id,
        StorageLayout.from_config(config),
        callbacks=[sweep_runs.tune_callback(tracker, sweep_run)],
    )
    saving = sweep_saving(outcome)
    tracker.log_metrics(sweep_run, _counts(outcome, saving))
    rows = {row.trial.trial_id: row for row in trial_rows(outcome, config.sweep.asha)}
    best = rows.get(outcome.best_trial_id or "")
    trial_runs = _tag_trial_fates(tracker, sweep_run, outcome, rows)
    tracker.set_tags(
        sweep_run,
        {
            "trainflow.searcher": outcome.searcher,
            "best_trial_id": outcome.best_trial_id,
            "best_params": outcome.best_params,
            "best_trial_name": best.name if best else "none",
            "best_trial_run_id": trial_runs.get(outcome.best_trial_id or "", "none"),
            **{f"best.{key}": value for key, value in outcome.best_params.items()},
            "mlflow.note.content": _sweep_note(outcome, best, saving),
        },
    )
    tracker.log_dict(sweep_run, outcome.to_dict(), "sweep_summary.json")
    _record_on_parent(tracker, parent_run, config, outcome)
    with tempfile.TemporaryDirectory() as tmp:
        for path in sweep_plots(outcome, config.sweep.asha, tmp).values():
            tracker.log_artifact(sweep_run, path, "plots")
    tracker.end_run(sweep_run)
    return outcome


def champion_params(config: PipelineConfig, best_params: dict[str, Any]) -> dict[str, Any]:
    """The swept keys' values the final training runs with (the flat keys the parent run left
    for the sweep; see Tracker.start_parent_run)."""
    best = config.with_overrides(best_params).flat()
    return {key: best[key] for key in config.sweep.search_space if key in best}


def _record_on_parent(
    tracker: Tracker, parent_run: str, config: PipelineConfig, outcome: SweepOutcome
) -> None:
    """The parent run gets the champion's values of the swept keys and the space they came
    from; a re-run of the same pipeline run keeps those it already has (params are final)."""
    logged = tracker.client.get_run(parent_run).data.params
    chosen = champion_params(config, outcome.best_params)
    tracker.log_params(parent_run, {k: v for k, v in chosen.items() if k not in logged})
    tracker.log_dict(parent_run, search_space(config), "search_space.json")


def _settings(config: PipelineConfig, manifest: Manifest) -> dict[str, Any]:
    """The sweep run's params: sample sizes, searcher, metric, ASHA and the search space."""
    sample = sample_sizes(config.sweep, manifest, drives_trainer(config))
    return {
        "sample_rows.train": sample["train"],
        "sample_rows.val": sample["val"],
        "num_samples": config.sweep.num_samples,
        "searcher": config.sweep.searcher,
        "metric": config.sweep.metric,
        "asha.max_t": config.sweep.asha.max_t,
        "asha.grace_period": config.sweep.asha.grace_period,
        "asha.reduction_factor": config.sweep.asha.reduction_factor,
        **search_space_params(config),
    }


def search_space(config: PipelineConfig) -> dict[str, Any]:
    """The swept keys and their domains, without the fields a domain leaves unset."""
    space = config.sweep.model_dump(mode="json", exclude_none=True)["search_space"]
    return {key: domain for key, domain in space.items() if domain is not None}


def search_space_params(config: PipelineConfig) -> dict[str, str]:
    """One param per swept key (``search_space.train.lr`` = ``{"type": "loguniform", ...}``):
    readable JSON in the params table; the whole space is the ``search_space.json`` artifact."""
    return {
        f"search_space.{key}": json.dumps(domain, sort_keys=True)
        for key, domain in search_space(config).items()
    }


def _counts(outcome: SweepOutcome, saving: float | None) -> dict[str, Any]:
    """The sweep run's metrics: the best value, trials by fate, epochs spent and saved."""
    statuses = [t.status for t in outcome.trials]
    return {
        f"best_{outcome.metric}": outcome.best_metric,
        "trials_run": len(statuses),
        "trials_completed": statuses.count("completed"),
        "trials_stopped_early": statuses.count("stopped-early"),
        "trials_errored": statuses.count("errored"),
        "epochs_spent": outcome.epochs_spent,
        "epochs_budget": outcome.epochs_budget,
        "epochs_saved_fraction": round(saving, 4) if saving is not None else None,
    }


def _sweep_note(outcome: SweepOutcome, best: TrialRow | None, saving: float | None) -> str:
    """The sweep run's description in the MLflow UI (markdown)."""
    statuses = [t.status for t in outcome.trials]
    lines = [
        f"**ASHA sweep** ({outcome.searcher} search): {len(statuses)} trials, "
        f"{statuses.count('completed')} completed, "
        f"{statuses.count('stopped-early')} stopped early, {statuses.count('errored')} errored.",
        "",
        f"Epochs spent: {outcome.epochs_spent} of a {outcome.epochs_budget} budget"
        + (f" ({saving:.0%} saved by early stopping)." if saving is not None else "."),
    ]
    if best:
        lines += ["", f"Best: **{best.name}**, {outcome.metric} = {outcome.best_metric:.4f}."]
    lines += ["", "Plots: artifacts/plots (learning curves, ASHA rungs, parameter vs metric)."]
    return "\n".join(lines)


def _fate_tags(outcome: SweepOutcome, trial, row: TrialRow | None) -> dict[str, Any]:
    """How one trial ended: completed, stopped by ASHA (at which rung), errored (why)."""
    tags = {"trainflow.trial_id": trial.trial_id, "trainflow.fate": trial.status}
    if row and row.fate:
        tags["trainflow.fate_detail"] = row.fate
        tags["mlflow.note.content"] = row.fate
    if trial.status == "stopped-early":
        tags["trainflow.stopped_at_iteration"] = trial.epochs
        if row and row.rung:
            tags["trainflow.stopped_at_rung"] = row.rung
    if trial.error:
        tags["trainflow.error"] = trial.error
    if trial.trial_id == outcome.best_trial_id:
        tags["trainflow.best"] = "true"
    return tags


def _trial_of(run, by_id: dict[str, Any]) -> Any:
    """The trial a run belongs to: its trial-id tag (Ray's own ``trial_name`` tag on runs
    logged before it)."""
    trial_id = run.data.tags.get(sweep_runs.TRIAL_ID_TAG)
    if trial_id:
        return by_id.get(trial_id)
    trial_name = run.data.tags.get("trial_name", "")
    return next((t for i, t in by_id.items() if trial_name and trial_name.endswith(i)), None)


def _tag_trial_fates(
    tracker: Tracker, sweep_run: str, outcome: SweepOutcome, rows: dict[str, TrialRow]
) -> dict[str, str]:
    """Name each trial's MLflow run ("trial 03 · lr=0.0031") and tag how it ended. Returns
    trial id -> MLflow run id."""
    by_id = {trial.trial_id: trial for trial in outcome.trials}
    found: dict[str, str] = {}
    for run in tracker.find_runs(sweep_run):
        if run.info.status == "KILLED":  # a killed process's attempt; Tune restarted the trial
            continue
        trial = _trial_of(run, by_id)
        if trial is None:
            continue
        row = rows.get(trial.trial_id)
        tracker.set_tags(run.info.run_id, _fate_tags(outcome, trial, row))
        if row and row.name:
            tracker.rename_run(run.info.run_id, row.name)
        found[trial.trial_id] = run.info.run_id
    return found
