"""Stage 5: the evaluated model logged and registered as a new version (alias ``challenger``);
the gate moves ``champion`` to it only if it wins."""

from __future__ import annotations

import tempfile

from training import progress
from training.config import PipelineConfig, registered_model_name
from training.loop.checkpoint import save_state
from training.manifest import Manifest
from training.stages.evaluated import Evaluated
from training.stages.gate_inputs import SameRows
from training.stages.train import Trained
from training.summary import ModelSummary
from training.tracking import flavour, lineage, model_evidence, registry, store, ui
from training.tracking.champion_scoring import log_decision
from training.tune.outcome import SweepOutcome


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


def promote(
    config: PipelineConfig,
    manifest: Manifest,
    trained: Trained,
    evaluated: Evaluated,
    parent_run: str,
    sweep: SweepOutcome | None = None,
    run_id: str | None = None,
    drift: dict | None = None,
) -> ModelSummary:
    """Log the pyfunc model, register a version, alias challenger; champion only if it wins
    (``drift``: the preprocess stage's ``DriftReport`` as a dict, for ``mlflow.gate.max_drift``)."""
    # Every text first: the MLflow calls follow, and the stage's outcome is the last step.
    metrics, metric = evaluated.result.metrics, config.mlflow.gate.metric
    description = _version_description(config, manifest, metrics, sweep)
    page = _registry_page(config, manifest)
    tracker = store.configure(config)
    with tempfile.TemporaryDirectory() as tmp:
        version = flavour.log_model(
            tracker,
            trained.run_id,
            save_state(evaluated.state, tmp),
            evaluated.example,
            description=description,
            tags={
                **lineage.version_tags(config, manifest, trained.run_id, parent_run, run_id),
                **{k: f"{v:.6g}" for k, v in metrics.items()},
            },
            # The best checkpoint's logged model, when the train stage logged each kept one.
            logged_model_uri=_checkpoint_model(trained),
        )
    epoch = trained.outcome.checkpoint_metrics.get("epoch") if trained.outcome else None
    model_evidence.link_evidence(
        tracker, version.model_id, manifest, trained.run_id, epoch, evaluated.run_id
    )
    registry.describe_model(tracker, page)
    same_rows = SameRows(config, version.name, evaluated, drift)
    gate = registry.promote(tracker, version.version, metrics[metric], judge=same_rows.judge)
    record = gate["record"]
    if record is not None:
        log_decision(tracker, parent_run, record, *same_rows.logged())
    described = (
        f"{description}; gate on {metric}: {gate['decision']} "
        f"({_gate_text(gate, metrics[metric])}; pipeline run {parent_run})"
        f"{_run_links(tracker, parent_run)}"
    )
    registry.describe_model(tracker, described, version=version.version)
    model_evidence.describe(tracker, version.model_id, described)
    tracker.set_tags(parent_run, {"model_version": version.version, "gate": gate["decision"]})
    progress.report(
        "promote",
        f"{version.name} version {version.version}: {gate['decision']} "
        f"({_gate_text(gate, metrics[metric])})",
        decision=gate["decision"],
    )
    return _outcome(version, gate)


def _checkpoint_model(trained: Trained) -> str | None:
    """The URI of the logged model the train stage made of the best checkpoint, if any."""
    if trained.outcome is None:
        return None
    model_id = trained.checkpoint_models.get(trained.outcome.checkpoint_path)
    return f"models:/{model_id}" if model_id else None


def _outcome(version: flavour.RegisteredVersion, gate: dict) -> ModelSummary:
    """The stage's outcome: the registered version and the gate's decision and record."""
    record = gate["record"]
    return ModelSummary(
        name=version.name,
        version=version.version,
        model_uri=version.model_uri,
        logged_model_uri=version.logged_model_uri,
        source_run_id=version.source_run_id,
        state_file=version.state_file,
        decision=gate["decision"],
        champion_version=gate["champion_version"],
        challenger_version=gate["challenger_version"],
        challenger_value=gate["challenger_value"],
        champion_value=gate["champion_value"],
        aliases=gate["aliases"],
        gate_record=record.to_dict() if record is not None else None,
    )


def _run_links(tracker, parent_run: str) -> str:
    """The version's runs as Markdown links (the UI renders the description as Markdown)."""
    links = ui.run_tree_links(tracker, parent_run)
    links["pipeline run"] = ui.run_page_url(tracker, parent_run)
    lines = [f"- [{label}]({url})" for label, url in links.items()]
    if not store.is_http(tracker.tracking_uri):
        lines.append(f"- (a local store: start the UI first with `{ui.command(tracker)}`)")
    return "\n\nRuns:\n" + "\n".join(lines)


def _gate_text(gate: dict, value: float) -> str:
    """The decision in words: the record's headline, or the stored-value comparison."""
    record = gate["record"]
    if record is not None and record.champion is not None:
        return record.headline
    if record is not None and gate["decision"] != "first-model":
        return record.reason
    champion = gate["champion_value"]
    against = f" vs champion {champion:.4f}" if champion is not None else ""
    return f"{value:.4f}{against}; champion: version {gate['champion_version']}"


def _version_description(
    config: PipelineConfig, manifest: Manifest, metrics: dict[str, float], sweep
) -> str:
    """The version's description: what was trained on what, how it was chosen, its score."""
    metric = config.mlflow.gate.metric
    return (
        f"{config.model.kind} trained on {manifest.source} (data {manifest.fingerprint}); "
        f"chosen as the {how_chosen(sweep)}; {metric}={metrics[metric]:.4f} on the test "
        "split's raw rows through this pyfunc model"
    )


def _registry_page(config: PipelineConfig, manifest: Manifest) -> str:
    """The registered model's description: what the model is, and what the aliases mean."""
    metric, name = config.mlflow.gate.metric, registered_model_name(config)
    outputs = (
        "the predicted number in a `prediction` column"
        if manifest.spec.is_regression
        else "the predicted label and one probability per class"
    )
    return (
        f"{config.model.kind} {manifest.spec.task} model trained by trainflow on "
        f"{manifest.source}. "
        f"Alias `{registry.CHAMPION}`: the version in use; `{registry.CHALLENGER}`: the latest "
        f"candidate. Each version is tagged with its source run, data fingerprint, config "
        f"hash, git commit, test metrics and the gate's decision ({metric}). An MLflow pyfunc: "
        f"`mlflow.pyfunc.load_model('models:/{name}@{registry.CHAMPION}')"
        f".predict(raw_table)` returns {outputs} (docs/serving.md)."
    )
