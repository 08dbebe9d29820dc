"""The run summary on the console: one compact key/value block, printed at the end of
``trainflow run`` (the HTML report and summary.json hold everything else)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from training.report.trials import fmt, fmt_metric
from training.tune.trials import count_fates, format_value

if TYPE_CHECKING:
    from training.summary import RunSummary


def mlflow_how_to_open(mlflow) -> str:
    """Open the parent run in the MLflow UI's training view; a local store's UI starts first."""
    if not mlflow.run_url:  # a summary written before the link
        return f"open: {mlflow.ui_command}"
    if mlflow.ui_command.startswith("mlflow ui"):
        return f"start the UI: {mlflow.ui_command} · then open: {mlflow.run_url}"
    return f"open: {mlflow.run_url}"


def summary_lines(summary: RunSummary, log_path: str | None = None) -> list[str]:
    """``key  value`` lines: run, data, sweep, test metrics, model, stage times, where to look.

    Plain lines, not a table: a value (a path, a command) stays whole on its line for copying."""
    data, mlflow, model, sweep = summary.data, summary.mlflow, summary.model, summary.sweep
    total = sum(summary.stage_seconds.values())
    rows = [
        ("run", f"{summary.run_id} · stages took {total:.0f} s"),
        (
            "data",
            f"{data.source} · rows "
            + " / ".join(f"{split} {n:,}" for split, n in data.rows.items())
            + f" · preprocessing {'reused' if data.preprocess_cached else 'computed'}",
        ),
    ]
    if sweep is not None:
        fates = ", ".join(f"{n} {fate}" for fate, n in count_fates(sweep.trials).items())
        params = " ".join(
            f"{k.rsplit('.', 1)[-1]}={format_value(v)}" for k, v in sweep.best_params.items()
        )
        rows.append(
            (
                "sweep",
                f"{len(sweep.trials)} trials ({fates}), {sweep.searcher} search; "
                f"best {sweep.metric} {fmt(sweep.best_metric)}: {params}",
            )
        )
    if summary.last_epoch:
        rows.append(("train", _train_detail(summary.last_epoch)))
    rows += [
        ("test", " · ".join(f"{k} {fmt_metric(v, k)}" for k, v in summary.test_metrics.items())),
        (
            "model",
            f"{model.name} version {model.version} · gate: {model.decision} · champion: "
            f"version {model.champion_version}{_gate_detail(model.gate_record)}",
        ),
        ("stages", " · ".join(f"{k} {v:.1f} s" for k, v in summary.stage_seconds.items())),
        ("MLflow", f"parent run {mlflow.parent_run_id} · {mlflow_how_to_open(mlflow)}"),
    ]
    if summary.outages:  # each is a row of the parent run's outages.json
        waited = sum(o["seconds"] for o in summary.outages)
        rows.append(
            (
                "outages",
                f"MLflow did not answer {len(summary.outages)} time(s), {waited:.0f} s in all",
            )
        )
    if summary.report:
        rows.append(("report", summary.report))
    if summary.ray_dashboard:  # an existing cluster's: still served after the run
        rows.append(("Ray", f"dashboard {summary.ray_dashboard}"))
    if log_path:
        rows.append(("log", log_path))
    width = max(len(key) for key, _ in rows)
    return [f"{key:<{width}}  {value}" for key, value in rows]


def _train_detail(last: dict[str, float]) -> str:
    """``20 epochs on 2 workers · last epoch 5,210 rows/s, 7 % waiting on data``."""
    text = f"{int(last.get('epoch', 0))} epochs"
    if last.get("workers"):
        text += f" on {int(last['workers'])} worker(s)"
    for key, unit in (("train_rows_per_s", "rows/s"), ("train_tokens_per_s", "tokens/s")):
        if key in last:
            text += f" · last epoch {last[key]:,.0f} {unit}"
            if "data_wait_share" in last:
                text += f", {last['data_wait_share']:.0%} waiting on data"
    return text


def _gate_detail(record: dict | None) -> str:
    """The gate's same-rows comparison, when it made one (`` · accuracy 0.98 vs ...``)."""
    if not record or record.get("champion") is None:
        return ""
    from training.gate.policy import GateRecord

    return f" · {GateRecord(**record).headline}"
