"""The run's Prefect markdown artifacts: the summary of a run, and the pointer to its HTML
report. Plain text in, markdown out: the flow publishes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.report.trials import fmt
from training.tune.trials import count_fates, sweep_saving

if TYPE_CHECKING:
    from training.summary import RunSummary


def summary_markdown(summary: RunSummary) -> str:
    """Data, sweep, test metrics, model and locations of a run, as markdown tables."""
    data, mlflow, model, sweep = summary.data, summary.mlflow, summary.model, summary.sweep
    lines = [
        f"# trainflow run `{summary.run_id}`",
        "",
        "| split | rows |",
        "|---|---|",
        *(f"| {split} | {rows} |" for split, rows in data.rows.items()),
        "",
        f"Data `{data.source}`, fingerprint `{data.fingerprint}`"
        + (" (preprocessing reused from cache)" if data.preprocess_cached else ""),
        "",
    ]
    if sweep:
        fates = count_fates(sweep.trials)
        lines += [
            f"## Sweep: best trial `{sweep.best_trial_id}`, "
            f"{sweep.metric} = {fmt(sweep.best_metric)}",
            "",
            "| param | value |",
            "|---|---|",
            *(f"| {k} | {fmt(v)} |" for k, v in sweep.best_params.items()),
            "",
            f"Trials: {', '.join(f'{n} {fate}' for fate, n in fates.items())}; "
            f"epochs {sweep.epochs_spent} of a {sweep.epochs_budget} budget.",
            "",
        ]
    lines += [
        "## Test metrics",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {fmt(v)} |" for k, v in summary.test_metrics.items()),
        "",
        "## Model",
        "",
        f"`{model.name}` version {model.version} — gate: **{model.decision}**, "
        f"aliases: {', '.join(model.aliases) or 'none'}, "
        f"champion: version {model.champion_version}",
        "",
        "## Where things are",
        "",
        f"- MLflow: experiment `{mlflow.experiment}` ({mlflow.experiment_id}), "
        f"parent run `{mlflow.parent_run_id}`, tracking `{mlflow.tracking_uri}`",
        *_ui_lines(mlflow),
        f"- Checkpoint: `{summary.checkpoint}`",
        f"- Run storage: `{summary.storage}`",
        "",
        "| stage | seconds |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in summary.stage_seconds.items()),
    ]
    return "\n".join(lines)


def _ui_lines(mlflow) -> list[str]:
    """Where to click: the parent run in the MLflow UI's training view (after starting the UI,
    for a local store)."""
    if not mlflow.run_url:
        return [f"- Open the UI: `{mlflow.ui_command}`"]
    if mlflow.ui_command.startswith("mlflow ui"):
        return [
            f"- Start the MLflow UI: `{mlflow.ui_command}`",
            f"- Then open the run: [{mlflow.run_url}]({mlflow.run_url})",
        ]
    return [f"- Open the run in the MLflow UI: [{mlflow.run_url}]({mlflow.run_url})"]


def report_markdown(summary: RunSummary, report_location: str) -> str:
    """The artifact that points at the HTML report."""
    model, sweep = summary.model, summary.sweep
    lines = [f"# trainflow report `{summary.run_id}`", ""]
    if sweep:
        saving = sweep_saving(sweep)
        lines.append(
            f"- sweep: best trial `{sweep.best_trial_id}`, {sweep.metric} = "
            f"{fmt(sweep.best_metric)}; {sweep.epochs_spent} of {sweep.epochs_budget} epochs"
            + (f" ({saving:.0%} saved by ASHA)" if saving is not None else "")
        )
    lines += [
        "- test: " + ", ".join(f"{k} = {fmt(v)}" for k, v in summary.test_metrics.items()),
        f"- model `{model.name}` version {model.version}: gate **{model.decision}**",
        "",
        f"Full report (config, data, sweep table, plots, metrics, gate): {report_location}",
    ]
    return "\n".join(lines)
