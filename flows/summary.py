"""The run summary as markdown (a Prefect artifact); the CLI renders the same dict with rich."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_markdown(summary: dict[str, Any]) -> str:
    data, mlflow, model = summary["data"], summary["mlflow"], summary["model"]
    lines = [
        f"# trainflow run `{summary['run_id']}`",
        "",
        "| split | rows |",
        "|---|---|",
        *(f"| {split} | {rows} |" for split, rows in data["rows"].items()),
        "",
        f"Data `{data['source']}`, fingerprint `{data['fingerprint']}`"
        + (" (preprocessing reused from cache)" if data["preprocess_cached"] else ""),
        "",
    ]
    sweep = summary.get("sweep")
    if sweep:
        fates: dict[str, int] = {}
        for trial in sweep["trials"]:
            fates[trial["status"]] = fates.get(trial["status"], 0) + 1
        lines += [
            f"## Sweep: best trial `{sweep['best_trial_id']}`, "
            f"{sweep['metric']} = {_fmt(sweep['best_metric'])}",
            "",
            "| param | value |",
            "|---|---|",
            *(f"| {k} | {_fmt(v)} |" for k, v in sweep["best_params"].items()),
            "",
            f"Trials: {', '.join(f'{n} {fate}' for fate, n in sorted(fates.items()))}; "
            f"epochs {sweep['epochs_spent']} of a {sweep['epochs_budget']} budget.",
            "",
        ]
    lines += [
        "## Test metrics",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {_fmt(v)} |" for k, v in summary["test_metrics"].items()),
        "",
        "## Model",
        "",
        f"`{model['name']}` version {model['version']} — gate: **{model['decision']}**, "
        f"aliases: {', '.join(model.get('aliases') or []) or 'none'}, "
        f"champion: version {model['champion_version']}",
        "",
        "## Where things are",
        "",
        f"- MLflow: experiment `{mlflow['experiment']}` ({mlflow['experiment_id']}), "
        f"parent run `{mlflow['parent_run_id']}`, tracking `{mlflow['tracking_uri']}`",
        f"- Open the UI: `{mlflow['ui_command']}`",
        f"- Checkpoint: `{summary['checkpoint']}`",
        f"- Run storage: `{summary['storage']}`",
        "",
        "| stage | seconds |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in summary["stage_seconds"].items()),
    ]
    return "\n".join(lines)
