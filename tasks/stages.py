"""One thin Prefect task per stage: retries and caching here, the work in ``training``."""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.policy import STAGE_TASK_OPTIONS
from training import progress
from training.config import PipelineConfig
from training.data import inputs
from training.data import preprocess as preprocessing
from training.inference.evaluate import EvalResult, evaluate_state, raw_rows
from training.loop.trainer import TrainOutcome, train_final
from training.manifest import Manifest
from training.model import factory, preflight
from training.platform import cluster
from training.report.plots import evaluation_plots, learning_curves_png, regression_plots
from training.report.sweep_plots import sweep_plots
from training.report.trials import TrialRow, sweep_saving, trial_rows
from training.storage import StorageLayout
from training.tracking import evaluation, lineage, pyfunc, registry, store, sweep_runs
from training.tune.outcome import SweepOutcome
from training.tune.sweep import run_sweep, sample_sizes


def connect_ray(config: PipelineConfig) -> dict[str, float]:
    """Idempotent: a retried task finds Ray already running in this process."""
    # A custom model's package, unless installed, travels to every worker (py_modules).
    resources = cluster.connect(config.ray, py_modules=factory.ship_paths(config.model))
    cluster.check_can_host(
        resources, config.train.min_workers, cluster.worker_resources(config.train)
    )
    cluster.check_shared_storage(StorageLayout.from_config(config).root)
    return resources


@task(name="inspect-data", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def inspect_data(config: PipelineConfig) -> tuple[list[str], str]:
    """Resolve the input files and fingerprint them with the preprocessing config."""
    endpoint = config.storage.endpoint_url
    files = inputs.resolve_inputs(config.data, endpoint, StorageLayout.from_config(config).root)
    fingerprint = inputs.fingerprint(config.data, files, endpoint)
    preflight.check_model(config, files, fingerprint)  # a custom model: checked before Ray
    return files, fingerprint


def _preprocess_cache_key(context, parameters: dict[str, Any]) -> str:
    # Same input bytes + same preprocessing config + same storage = same output: reuse it.
    layout = StorageLayout.from_config(parameters["config"])
    where = hashlib.sha256(layout.data_dir(parameters["fingerprint"]).encode()).hexdigest()[:12]
    return f"preprocess-{parameters['fingerprint']}-{where}"


@task(
    name="preprocess",
    cache_key_fn=_preprocess_cache_key,
    persist_result=True,
    **STAGE_TASK_OPTIONS,
)
def preprocess(config: PipelineConfig, fingerprint: str, files: list[str]) -> Manifest:
    connect_ray(config)
    return preprocessing.preprocess(config, StorageLayout.from_config(config), fingerprint, files)


@task(name="sweep", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def sweep(config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str) -> SweepOutcome:
    connect_ray(config)
    tracker = store.configure(config)
    sweep_run = tracker.start_child_run(parent_run, "sweep", stage="sweep")
    lineage.log_datasets(tracker, sweep_run, manifest, ["train", "val"])
    sample = sample_sizes(config.sweep, manifest)
    tracker.log_params(
        sweep_run,
        {
            "sample_rows.train": sample["train"],
            "sample_rows.val": sample["val"],
            "num_samples": config.sweep.num_samples,
            "searcher": config.sweep.searcher,
            "metric": config.sweep.metric,
            "asha.max_t": config.sweep.asha.max_t,
            "asha.grace_period": config.sweep.asha.grace_period,
            "asha.reduction_factor": config.sweep.asha.reduction_factor,
            "search_space": config.sweep.model_dump(mode="json")["search_space"],
        },
    )
    outcome = run_sweep(
        config,
        manifest,
        run_id,
        StorageLayout.from_config(config),
        callbacks=[sweep_runs.tune_callback(tracker, sweep_run)],
    )
    statuses = [t.status for t in outcome.trials]
    saving = sweep_saving(outcome)
    tracker.log_metrics(
        sweep_run,
        {
            f"best_{outcome.metric}": outcome.best_metric,
            "trials_run": len(statuses),
            "trials_completed": statuses.count("completed"),
            "trials_stopped_early": statuses.count("stopped-early"),
            "trials_errored": statuses.count("errored"),
            "epochs_spent": outcome.epochs_spent,
            "epochs_budget": outcome.epochs_budget,
            "epochs_saved_fraction": saving,
        },
    )
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
    with tempfile.TemporaryDirectory() as tmp:
        for path in sweep_plots(outcome, config.sweep.asha, tmp).values():
            tracker.log_artifact(sweep_run, path, "plots")
    tracker.end_run(sweep_run)
    return outcome


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


def _tag_trial_fates(
    tracker, sweep_run: str, outcome: SweepOutcome, rows: dict[str, TrialRow]
) -> dict[str, str]:
    """Name each trial's MLflow run ("trial 03 · lr=0.0031") and tag how it ended: completed,
    stopped by ASHA (at which rung), errored (why). Returns trial id -> MLflow run id."""
    by_id = {trial.trial_id: trial for trial in outcome.trials}
    found: dict[str, str] = {}
    for run in tracker.find_runs(sweep_run):
        if run.info.status == "KILLED":  # a killed process's attempt; Tune restarted the trial
            continue
        trial_name = run.data.tags.get("trial_name", "")
        trial = next((t for i, t in by_id.items() if trial_name.endswith(i)), None)
        if trial is None:
            continue
        row = rows.get(trial.trial_id)
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
        tracker.set_tags(run.info.run_id, tags)
        if row and row.name:
            tracker.rename_run(run.info.run_id, row.name)
        found[trial.trial_id] = run.info.run_id
    return found


@task(name="train", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def train(
    config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str
) -> tuple[TrainOutcome, str]:
    """Final DDP training; returns the outcome and its MLflow run id (the model's source run)."""
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
    outcome = train_final(config, manifest, run_id, StorageLayout.from_config(config))
    tracker.log_history(train_run, outcome.history, step_key="epoch")
    tracker.set_tags(train_run, {"checkpoint_path": outcome.checkpoint_path})
    with tempfile.TemporaryDirectory() as tmp:
        curves = learning_curves_png(outcome.history, os.path.join(tmp, "curves.png"))
        tracker.log_artifact(train_run, curves, "plots")
    tracker.end_run(train_run)
    return outcome, train_run


def _load_checkpoint_state(config: PipelineConfig, checkpoint_path: str) -> dict[str, Any]:
    from ray.train import Checkpoint

    from training.loop.checkpoint import load_model_state
    from training.storage import filesystem, is_remote

    fs, path = filesystem(checkpoint_path, config.storage.endpoint_url)
    remote = is_remote(checkpoint_path)
    checkpoint = Checkpoint(path if remote else checkpoint_path, filesystem=fs if remote else None)
    with checkpoint.as_directory() as directory:
        return load_model_state(directory)


@task(name="evaluate", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def evaluate(
    config: PipelineConfig, manifest: Manifest, checkpoint_path: str, parent_run: str
) -> EvalResult:
    """Score the test split's raw rows through the pyfunc model the checkpoint becomes; log
    trainflow's report and MLflow's own evaluation (classifier or regressor) of the same
    predictions."""
    connect_ray(config)
    tracker = store.configure(config)
    eval_run = tracker.start_child_run(parent_run, "evaluate", stage="evaluate")
    tracker.set_tags(eval_run, {"checkpoint_path": checkpoint_path})
    lineage.log_datasets(tracker, eval_run, manifest, ["test"])
    endpoint = config.storage.endpoint_url
    result, scored = evaluate_state(
        _load_checkpoint_state(config, checkpoint_path),
        manifest,
        endpoint_url=endpoint,
        raw_example=raw_rows(manifest, "test", pyfunc.EXAMPLE_ROWS, endpoint),
        use_gpu=config.train.use_gpu,
    )
    tracker.log_metrics(eval_run, result.metrics)
    with tempfile.TemporaryDirectory() as tmp:
        if result.task == "regression":
            plots = regression_plots(result.actual, result.predicted, tmp)
        else:
            tracker.log_dict(eval_run, result.per_class, "per_class.json")
            confusion = {"classes": result.class_names, "matrix": result.confusion}
            tracker.log_dict(eval_run, confusion, "confusion.json")
            plots = evaluation_plots(result.per_class, result.confusion, result.class_names, tmp)
        for png in plots.values():
            tracker.log_artifact(eval_run, png, "plots")
    evaluation.evaluate_predictions(
        tracker, eval_run, scored.labels, scored.predictions, scored.probs, scored.classes
    )
    tracker.log_metrics(parent_run, result.metrics)
    tracker.end_run(eval_run)
    progress.report("evaluate", result.headline, metrics=result.metrics)
    return result


def how_chosen(sweep: SweepOutcome | None) -> str:
    """How the trained configuration was chosen, for the model version's description."""
    if sweep is None or not sweep.best_trial_id:
        return "configuration as given (no sweep)"
    params = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sweep.best_params.items()
    )
    return (
        f"best of {len(sweep.trials)} ASHA trials (trial {sweep.best_trial_id}, "
        f"{sweep.metric}={sweep.best_metric:.4f}; {params})"
    )


@task(name="promote", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def promote(
    config: PipelineConfig,
    manifest: Manifest,
    train_outcome: TrainOutcome,
    train_run: str,
    eval_result: EvalResult,
    parent_run: str,
    chosen_by: str = "configuration as given",
    run_id: str | None = None,
) -> dict[str, Any]:
    """Log the pyfunc model, register a version, alias challenger; champion only if it wins."""
    tracker = store.configure(config)
    state = _load_checkpoint_state(config, train_outcome.checkpoint_path)
    example = raw_rows(manifest, "test", pyfunc.EXAMPLE_ROWS, config.storage.endpoint_url)
    metric = config.mlflow.gate.metric
    description = (
        f"{config.model.kind} trained on {manifest.source} (data {manifest.fingerprint}); "
        f"chosen as the {chosen_by}; {metric}={eval_result.metrics[metric]:.4f} on the test "
        "split's raw rows through this pyfunc model"
    )
    with tempfile.TemporaryDirectory() as tmp:
        from training.loop.checkpoint import save_state

        state_path = save_state({k: v for k, v in state.items() if k != "optimizer"}, tmp)
        version = registry.log_and_register_model(
            tracker,
            train_run,
            state_path,
            example,
            description=description,
            tags={
                **lineage.version_tags(config, manifest, train_run, parent_run, run_id),
                **{k: f"{v:.6g}" for k, v in eval_result.metrics.items()},
            },
        )
    decision = registry.promote(tracker, version["version"], eval_result.metrics[metric])
    champion_value = decision["champion_value"]
    against = f" vs champion {champion_value:.4f}" if champion_value is not None else ""
    registry.describe_model(
        tracker,
        f"{description}; gate on {metric}: {decision['decision']} "
        f"({eval_result.metrics[metric]:.4f}{against}; pipeline run {parent_run})",
        version=version["version"],
    )
    # The registry page: what the model is, and what the aliases mean.
    outputs = (
        "the predicted number in a `prediction` column"
        if manifest.spec.is_regression
        else "the predicted label and one probability per class"
    )
    registry.describe_model(
        tracker,
        f"{config.model.kind} {manifest.spec.task} model trained by trainflow on "
        f"{manifest.source}. "
        f"Alias `{registry.CHAMPION}`: the version in use; `{registry.CHALLENGER}`: the latest "
        f"candidate. Each version is tagged with its source run, data fingerprint, config "
        f"hash, git commit, test metrics and the gate's decision ({metric}). An MLflow pyfunc: "
        f"`mlflow.pyfunc.load_model('models:/{version['name']}@{registry.CHAMPION}')"
        f".predict(raw_table)` returns {outputs} (docs/serving.md).",
    )
    tracker.set_tags(
        parent_run, {"model_version": version["version"], "gate": decision["decision"]}
    )
    champion = decision["champion_version"]
    progress.report(
        "promote",
        f"{version['name']} version {version['version']}: {decision['decision']} "
        f"(champion: version {champion})",
        decision=decision["decision"],
    )
    return {**version, **decision}
