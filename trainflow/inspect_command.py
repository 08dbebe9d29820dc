"""``trainflow inspect``: what a run would make of the table, in seconds and without Ray,
Prefect, MLflow or training (``training/data/overview.py``): each column's role and why, its
missing values, the task, the classes and the splits; or the one-line error a run would give."""

from __future__ import annotations

from pathlib import Path

import typer

from trainflow.output import console

ConfigOption = typer.Option(
    None, "--config", "-c", help="YAML file of overrides (see configs/default.yaml)."
)
SetOption = typer.Option(
    None, "--set", "-s", help="Override one key, e.g. --set data.label_column=y (repeatable)."
)


def inspect(config_file: Path | None = ConfigOption, overrides: list[str] | None = SetOption):
    """Show how a run would read the data: column roles, gaps, task, classes, splits."""
    from training.config.overrides import load_config
    from training.data.overview import overview

    view = overview(load_config(config_file, list(overrides or [])))
    for line in overview_lines(view):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def overview_lines(view) -> list[str]:
    """The overview as console lines: a header, one aligned line per column, then the task,
    the classes and the splits."""
    kind = "image" if view.fmt == "images" else view.fmt
    files = f"{view.files} {kind} file{'s' if view.files != 1 else ''}"
    rows = f", {view.rows:,} rows" if view.rows else ""
    lines = [f"data: {view.source} ({files}{rows})"]
    if view.note:
        return [*lines, f"input: {view.note}"]
    lines += _column_lines(view.columns)
    lines.append(f"task: {view.task} ({view.task_reason})")
    if view.classes:
        lines.append(f"classes: {_shares(view.classes)}")
    if view.label_stats is not None:
        mean, std = view.label_stats
        lines.append(f"label: mean {mean:.6g}, std {std:.6g} (train split)")
    lines.append("splits: " + ", ".join(f"{s} {n:,}" for s, n in view.splits.items()))
    return lines


def _column_lines(columns) -> list[str]:
    """``name  role  missing  why``, aligned."""
    header = ("column", "role", "missing", "how")
    cells = [header] + [
        (c.name, c.role, "-" if c.missing is None else f"{c.missing:,}", c.detail) for c in columns
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    return [
        f"  {name:<{widths[0]}}  {role:<{widths[1]}}  {missing:>{widths[2]}}  {detail}".rstrip()
        for name, role, missing, detail in cells
    ]


def _shares(classes: list[tuple[str, int]]) -> str:
    """``Adelie: 152 (44.2%), Gentoo: 124 (36.0%), ... +3 more``."""
    from training.data.overview import CLASSES_LISTED

    total = sum(n for _, n in classes) or 1
    shown = [f"{c}: {n:,} ({100 * n / total:.1f}%)" for c, n in classes[:CLASSES_LISTED]]
    more = len(classes) - CLASSES_LISTED
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")
