"""The self-contained HTML report of a pipeline run: ``templates/report.html.j2`` rendered by
jinja2 (autoescape on) with the run's plots embedded as base64 PNGs."""

from __future__ import annotations

import base64
import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from training.metrics import direction
from training.platform.secrets import redact
from training.report.plots import evaluation_plots, learning_curves_png, regression_plots
from training.report.sweep_plots import sweep_plots
from training.report.trials import fmt, fmt_metric, is_number, swept_params
from training.tune.trials import FATES, TrialRow, format_value, sweep_saving, trial_rows

if TYPE_CHECKING:
    from training.config import AshaConfig, PipelineConfig
    from training.summary import RunSummary
    from training.tune.outcome import SweepOutcome

TEMPLATE = "report.html.j2"
REPORT_SECTIONS = ("summary", "data", "sweep", "plots", "test-metrics", "gate", "config", "where")


@functools.cache
def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("training.report", "templates"),
        autoescape=True,  # every value is text; the template's own markup is the only HTML
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = fmt
    env.filters["fmt_metric"] = fmt_metric
    env.filters["format_value"] = format_value
    return env


def _png_base64(path: str) -> str:
    with open(path, "rb") as handle:
        return base64.b64encode(handle.read()).decode("ascii")


def _best_first(rows: Sequence[TrialRow], metric: str) -> list[TrialRow]:
    """Trials by their last ``metric``, best first; trials without a value last."""
    sign = 1 if direction(metric) == "max" else -1

    def key(row: TrialRow) -> tuple[bool, float]:
        value = (row.trial.metrics or {}).get(metric)
        return (not is_number(value), -sign * float(value or 0))

    return sorted(rows, key=key)


def _sweep_context(sweep: SweepOutcome | None, asha: AshaConfig) -> dict[str, Any]:
    if not sweep:
        return {"sweep": None, "trial_metrics": []}
    rows = trial_rows(sweep, asha)
    return {
        "sweep": sweep,
        "best": next((row for row in rows if row.best), None),
        # Every fate, zeros too: "3 completed, 1 stopped-early, 0 errored".
        "fates": ", ".join(
            f"{sum(1 for t in sweep.trials if t.status == fate)} {fate}" for fate in FATES
        ),
        "saving": sweep_saving(sweep),
        "params": swept_params(sweep.trials),
        "trials": _best_first(rows, sweep.metric or "val_accuracy"),
        # The trials table's metric columns: the ranked one, then the loss.
        "trial_metrics": list(dict.fromkeys([sweep.metric or "val_accuracy", "val_loss"])),
    }


def report_html(
    summary: RunSummary,
    config: PipelineConfig,
    plots: Mapping[str, str],
    per_class: Sequence[Mapping[str, Any]] | None = None,
    links: Mapping[str, str] | None = None,
) -> str:
    """One self-contained HTML page of a pipeline run.

    ``plots`` maps a caption to a PNG file (embedded), ``per_class`` holds the rows of
    ``EvalResult.per_class``, ``links`` optional name -> URL (MLflow pages). The resolved config
    is shown as YAML with credentials in URIs redacted.
    """
    import yaml

    config_text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    return (
        _environment()
        .get_template(TEMPLATE)
        .render(
            summary=summary,
            gate_metric=config.mlflow.gate.metric,
            generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            images=[(title, _png_base64(path)) for title, path in plots.items()],
            per_class=list(per_class or []),
            config_text=redact(config_text),
            links=dict(links or {}),
            **_sweep_context(summary.sweep, config.sweep.asha),
        )
    )


def report_plots(
    directory: str,
    sweep: SweepOutcome | None = None,
    asha: AshaConfig | None = None,
    train_history: Sequence[Mapping[str, Any]] | None = None,
    per_class: Sequence[Mapping[str, Any]] | None = None,
    confusion: Any = None,
    class_names: Sequence[str] | None = None,
    actual: Sequence[float] | None = None,
    predicted: Sequence[float] | None = None,
    logged: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every plot of a pipeline run for the HTML report, as ``{caption: path}`` in stage order:
    a classifier's confusion matrix and per-class scores, or a regression's predicted-vs-actual
    and residuals (``actual`` and ``predicted`` given).

    ``logged``: the PNGs the stages already drew and logged, by file name; a stage's plots are
    taken from there when all of them are, and drawn again only when not (~1 s a run saved).
    """
    logged = dict(logged or {})
    plots: dict[str, str] = {}
    if sweep and asha is not None:
        metric = sweep.metric or "val_accuracy"
        if "sweep_curves.png" in logged and "asha_rungs.png" in logged:
            drawn = {
                name: path
                for name, path in logged.items()
                if name in ("sweep_curves.png", "asha_rungs.png") or name.startswith("param_")
            }
        else:
            drawn = sweep_plots(sweep, asha, directory)
        for name, path in drawn.items():
            if name == "sweep_curves.png":
                caption = "sweep: learning curves of all trials"
            elif name == "asha_rungs.png":
                caption = "sweep: trials alive per iteration (ASHA rungs)"
            else:
                caption = f"sweep: {name.removeprefix('param_').removesuffix('.png')} vs {metric}"
            plots[caption] = path
    if train_history is not None:
        plots["final training: train/val curves"] = logged.get("curves.png") or (
            learning_curves_png(list(train_history), os.path.join(directory, "curves.png"))
        )
    if per_class is not None and confusion is not None and class_names:  # a classifier
        files = _logged_or(logged, ("confusion_matrix.png", "per_class.png")) or (
            evaluation_plots(per_class, confusion, class_names, directory)
        )
        plots["evaluation: confusion matrix (test split)"] = files["confusion_matrix.png"]
        plots["evaluation: per-class precision and recall"] = files["per_class.png"]
    if actual and predicted is not None:
        files = _logged_or(logged, ("predicted_vs_actual.png", "residuals.png")) or (
            regression_plots(actual, predicted, directory)
        )
        plots["evaluation: predicted vs actual (test split)"] = files["predicted_vs_actual.png"]
        plots["evaluation: residuals (test split)"] = files["residuals.png"]
    return plots


def _logged_or(logged: Mapping[str, str], names: Sequence[str]) -> dict[str, str] | None:
    """``{name: path}`` of ``names`` when every one of them was logged, else None."""
    if all(name in logged for name in names):
        return {name: logged[name] for name in names}
    return None
