"""The run's Prefect markdown artifacts: the summary of a run, and the pointer to its HTML
report. Plain text in, markdown out: the flow publishes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.metrics import direction
from training.report.trials import fmt, fmt_metric
from training.tune.trials import count_fates, sweep_saving, trial_rows

if TYPE_CHECKING:
    from training.config import AshaConfig
    from training.summary import RunSummary
    from training.tune.outcome import SweepOutcome, TrialSummary


def summary_markdown(summary: RunSummary) -> str:
    """Data, sweep, test metrics, model and locations of a run, as markdown tables."""
    data, mlflow, model, sweep = summary.data, summary.mlflow, summary.model, summary.sweep
    lines = [
        f"# trainflow run `{summary.run_id}`",
        "",
        "| split | rows |",
        "|---|---|",
        *(f"| {split} | {rows:,} |" for split, rows in data.rows.items()),
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
        *(f"| {k} | {fmt_metric(v, k)} |" for k, v in summary.test_metrics.items()),
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
        "- test: "
        + ", ".join(f"{k} = {fmt_metric(v, k)}" for k, v in summary.test_metrics.items()),
        f"- model `{model.name}` version {model.version}: gate **{model.decision}**",
        "",
        f"Full report (config, data, sweep table, plots, metrics, gate): {report_location}",
    ]
    return "\n".join(lines)


def best_value(trial: TrialSummary, metric: str) -> float | None:
    """The trial's best value of ``metric`` over its epochs (its last metrics without history)."""
    values = [row[metric] for row in trial.history if row.get(metric) is not None]
    if not values:
        return trial.metrics.get(metric)
    return (max if direction(metric) == "max" else min)(values)


def trials_table(sweep: SweepOutcome, asha: AshaConfig) -> list[dict[str, object]]:
    """One row per trial for a table artifact: name, sampled values, best metric, epochs, fate."""
    rows = []
    for row in trial_rows(sweep, asha):
        trial, best = row.trial, best_value(row.trial, sweep.metric)
        rows.append(
            {
                "trial": row.name.split(" · ", 1)[0] + (" (best)" if row.best else ""),
                **{key: fmt(value) for key, value in (trial.params or {}).items()},
                f"best {sweep.metric}": fmt(round(best, 4)) if best is not None else "-",
                "epochs": f"{trial.epochs} of {asha.max_t}",
                "fate": row.fate or trial.status,
            }
        )
    return rows


def parent_run_note(summary: RunSummary, links: dict[str, str]) -> str:
    """The pipeline run's description in the MLflow UI (``mlflow.note.content``): what came out
    and links to the runs and the model version it came from."""
    model, sweep = summary.model, summary.sweep
    lines = [f"**trainflow pipeline run `{summary.run_id}`**: data `{summary.data.source}`.", ""]
    if sweep:
        lines += [
            f"Sweep: {len(sweep.trials)} trials; the champion's params (this run's params) are "
            f"the best trial's, {sweep.metric} = {fmt(sweep.best_metric)}.",
            "",
        ]
    lines += [
        "Test: "
        + ", ".join(f"{k} = {fmt_metric(v, k)}" for k, v in summary.test_metrics.items())
        + ".",
        "",
        f"Model `{model.name}` version {model.version}: gate **{model.decision}**.",
        "",
        *(f"- [{label}]({url})" for label, url in links.items()),
    ]
    return "\n".join(lines)
