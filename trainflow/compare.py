"""``trainflow compare``: a sweep's trials read back from MLflow, side by side, best first, with
the MLflow UI address of the compare view.

Everything MLflow comes through ``training.tracking`` (``sweep_runs.sweep_trials`` returns plain
dicts); this module only sorts, formats and prints them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trainflow.output import console
from training.errors import TrainflowError

WIDE = 200  # columns when stdout is not a terminal: keep names and URLs on one line


def _number(value: Any) -> float | None:
    """A finite float from a number or a numeric string (MLflow params are strings)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt(value: Any) -> str:
    """4 significant digits for numbers (params arrive as strings), "-" for nothing."""
    if value is None or value == "":
        return "-"
    number = _number(value)
    if number is None:
        return str(value)
    if number == int(number) and abs(number) < 1e6 and "." not in str(value):
        return str(int(number))
    return f"{number:.4g}"


def sort_trials(trials: Iterable[Mapping[str, Any]], mode: str = "max") -> list[dict[str, Any]]:
    """Best first by ``best_value`` (highest for mode max, lowest for min); trials without a
    value last, in name order."""

    def key(trial: Mapping[str, Any]):
        value = _number(trial.get("best_value"))
        if value is None:
            return (1, 0.0, str(trial.get("name") or ""))
        return (0, -value if mode == "max" else value, str(trial.get("name") or ""))

    return [dict(t) for t in sorted(trials, key=key)]


def param_keys(trials: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: set[str] = set()
    for trial in trials:
        keys.update(trial.get("params") or {})
    return sorted(keys)


def trials_table(sweep: Mapping[str, Any], trials: Sequence[Mapping[str, Any]]) -> Table:
    """One row per trial (already sorted): rank, name, params, best metric, epochs, fate."""
    metric = sweep.get("metric", "val_accuracy")
    max_t = sweep.get("max_t")
    table = Table(
        title=(
            f"sweep {sweep.get('sweep_run_id')} of {sweep.get('parent_run_name') or '?'} "
            f"(experiment {sweep.get('experiment')!r}): {len(trials)} trials by best {metric}, "
            "best first"
        ),
        title_justify="left",
    )
    table.add_column("#", justify="right")
    table.add_column("trial", no_wrap=True)
    keys = param_keys(trials)
    for key in keys:
        table.add_column(key, justify="right")
    table.add_column(f"best {metric}", justify="right")
    table.add_column("epochs", justify="right")
    table.add_column("fate")
    table.add_column("run id", no_wrap=True)
    for rank, trial in enumerate(trials, start=1):
        epochs = str(trial.get("epochs", "-"))
        if max_t:
            epochs = f"{epochs}/{max_t}"
        name = str(trial.get("name") or trial.get("run_id"))
        table.add_row(
            str(rank),
            name + (" (best)" if trial.get("best") else ""),
            *(fmt((trial.get("params") or {}).get(key)) for key in keys),
            fmt(trial.get("best_value")),
            epochs,
            str(trial.get("fate_detail") or trial.get("fate") or trial.get("status") or "-"),
            str(trial.get("run_id")),
            style="bold green" if trial.get("best") else None,
        )
    return table


def where_to_compare(tracker, sweep: Mapping[str, Any], trials: Sequence[Mapping]) -> list[str]:
    """Lines that say how to open the compare view of ``trials`` in the MLflow UI."""
    from training.tracking import ui

    url = ui.compare_url(tracker, [t["run_id"] for t in trials], [sweep["experiment_id"]])
    if ui.run_url(tracker, sweep["sweep_run_id"]) is not None:  # a tracking server
        return [f"compare view in the MLflow UI: {url}"]
    return [
        f"start the MLflow UI: {ui.command(tracker)}",
        f"then open the compare view: {url}",
    ]


def compare(
    experiment: str | None = typer.Option(
        None, "--experiment", "-e", help="MLflow experiment (default: mlflow.experiment)."
    ),
    run: str | None = typer.Option(
        None,
        "--run",
        "-r",
        help="A pipeline (parent) run id, its sweep run or a trial run (default: latest sweep).",
    ),
    config_file: Path | None = typer.Option(
        None, "--config", "-c", help="YAML file of overrides (see configs/default.yaml)."
    ),
    overrides: list[str] | None = typer.Option(
        None, "--set", "-s", help="Override one key, e.g. --set mlflow.tracking_uri=http://..."
    ),
) -> None:
    """Compare a sweep's trials from MLflow: params, best val metric, epochs, fate; best first."""
    from training.config.overrides import load_config
    from training.tracking import store, sweep_runs

    config = load_config(config_file, list(overrides or []))
    if experiment is not None:
        config = config.with_overrides({"mlflow.experiment": experiment})
    tracker = store.configure(config, create=False)
    sweep = sweep_runs.sweep_trials(tracker, run)
    if not sweep["trials"]:
        raise TrainflowError(
            f"sweep run {sweep['sweep_run_id']} of experiment {sweep['experiment']!r} has no "
            "trial runs (still starting, or its trials were deleted)"
        )
    trials = sort_trials(sweep["trials"], sweep.get("mode", "max"))
    out = console if console.is_terminal else Console(width=WIDE)
    out.print(trials_table(sweep, trials))
    for line in where_to_compare(tracker, sweep, trials):
        out.print(line, soft_wrap=True, highlight=False, markup=False)
