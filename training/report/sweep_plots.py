"""Plots of a sweep (PNG files): every trial's learning curves, trials alive per ASHA rung, and
each swept parameter against the metric. They take :class:`~training.tune.trials.TrialRow`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from training.report.plots import pyplot, save
from training.report.trials import is_number, swept_params
from training.tune.trials import (
    FATES,
    TrialRow,
    format_value,
    milestones_of,
    trial_number,
    trial_rows,
)

if TYPE_CHECKING:
    from training.config import AshaConfig
    from training.tune.outcome import SweepOutcome

_FATE_LINE = {
    "completed": {"linestyle": "-", "marker": "o"},
    "stopped-early": {"linestyle": "--", "marker": "o"},
    "errored": {"linestyle": ":", "marker": "x"},
}
_FATE_COLOR = {"completed": "C2", "stopped-early": "C1", "errored": "C3"}


def _points(row: TrialRow, metric: str) -> list[tuple[float, float]]:
    return [
        (float(epoch.get("epoch", i + 1)), float(epoch[metric]))
        for i, epoch in enumerate(row.trial.history or [])
        if is_number(epoch.get(metric))
    ]


def _curve_label(row: TrialRow) -> str:
    if row.rung:
        return f"{row.name} (stopped at rung {row.rung})"
    if row.trial.status != "completed":
        return f"{row.name} ({row.trial.status})"
    return row.name


def sweep_curves_figure(
    rows: Sequence[TrialRow],
    max_t: int,
    milestones: Sequence[int] = (),
    metrics: Sequence[str] = ("val_accuracy", "val_loss"),
):
    """One panel per metric, one line per trial. Stopped trials are dashed and end in a cross
    where ASHA cut them; dotted verticals mark the rungs."""
    shown = [m for m in metrics if any(_points(row, m) for row in rows)] or list(metrics[:1])
    fig, axes = pyplot().subplots(1, len(shown), figsize=(6.5 * len(shown), 4.6), squeeze=False)
    for ax, metric in zip(axes[0], shown, strict=True):
        for k, row in enumerate(rows):
            points = _points(row, metric)
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            status = row.trial.status
            color = f"C{k % 10}"
            ax.plot(
                xs,
                ys,
                color=color,
                label=_curve_label(row),
                linewidth=2.6 if row.best else 1.4,
                **_FATE_LINE.get(status, {"linestyle": "-", "marker": "."}),
            )
            if status != "completed":  # where the trial was cut short
                ax.plot(xs[-1], ys[-1], marker="X", markersize=11, color=color, label="_cut")
        for milestone in milestones:
            ax.axvline(milestone, color="grey", linestyle=":", linewidth=0.9, label="_rung")
        ax.set_xlim(0.7, max(max_t, 1) + 0.3)
        if max_t <= 30:
            ax.set_xticks(range(1, max_t + 1))
        ax.set_xlabel("iteration (epoch)")
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(3, len(handles)),
            fontsize=8,
        )
    fig.suptitle(
        "sweep: learning curves of all trials "
        "(dashed + cross: stopped by ASHA; dotted lines: rungs; thick: best)"
    )
    fig.tight_layout()
    return fig


def asha_rungs_figure(
    rows: Sequence[TrialRow],
    max_t: int,
    milestones: Sequence[int] = (),
    epochs_spent: int | None = None,
    epochs_budget: int | None = None,
):
    """Bars: how many trials were still alive at each iteration; rung iterations highlighted
    and annotated with how many trials ASHA stopped there."""
    iterations = list(range(1, max(max_t, 1) + 1))
    epochs = [int(row.trial.epochs or 0) for row in rows]
    alive = [sum(1 for e in epochs if e >= i) for i in iterations]
    colors = ["C1" if i in milestones else "C0" for i in iterations]
    fig, ax = pyplot().subplots(figsize=(max(5.0, 0.5 * len(iterations) + 3), 4))
    bars = ax.bar(iterations, alive, color=colors, edgecolor="black", linewidth=0.5)
    top = max(alive, default=0)
    for bar, count in zip(bars, alive, strict=True):
        ax.annotate(
            str(count),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    for rung, milestone in enumerate(milestones, start=1):
        stopped = sum(
            1
            for row in rows
            if row.trial.status == "stopped-early" and int(row.trial.epochs or 0) == milestone
        )
        ax.annotate(
            f"rung {rung}\n{stopped} stopped",
            (milestone, top * 1.08 + 0.3),
            ha="center",
            va="bottom",
            fontsize=8,
            color="C1",
        )
    ax.set_ylim(0, top * 1.35 + 1)
    if len(iterations) <= 30:
        ax.set_xticks(iterations)
    ax.set_xlabel("iteration (epoch)")
    ax.set_ylabel("trials alive")
    title = "ASHA: trials alive per iteration (orange: rungs)"
    if epochs_budget:
        spent = epochs_spent if epochs_spent is not None else sum(epochs)
        title += f"\n{spent} of {epochs_budget} epochs spent, {1 - spent / epochs_budget:.0%} saved"
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def param_metric_figure(rows: Sequence[TrialRow], param: str, metric: str = "val_accuracy"):
    """Each trial's value of ``param`` against its last reported ``metric``: one scatter series
    per fate, the best trial ringed, points labelled with the trial number."""
    fig, ax = pyplot().subplots(figsize=(6, 4.2))
    points = [
        (row, (row.trial.params or {}).get(param), (row.trial.metrics or {}).get(metric))
        for row in rows
    ]
    points = [(row, x, y) for row, x, y in points if x is not None and is_number(y)]
    if points and all(is_number(x) for _, x, _ in points):
        position = {id(row): float(x) for row, x, _ in points}
        values = list(position.values())
        if min(values) > 0 and max(values) / min(values) >= 20:
            ax.set_xscale("log")
    else:
        categories = sorted({format_value(x) for _, x, _ in points})
        position = {id(row): float(categories.index(format_value(x))) for row, x, _ in points}
        ax.set_xticks(range(len(categories)), labels=categories)
    for fate in FATES:
        members = [(row, y) for row, _, y in points if row.trial.status == fate]
        if not members:
            continue
        ax.scatter(
            [position[id(row)] for row, _ in members],
            [float(y) for _, y in members],
            color=_FATE_COLOR[fate],
            label=fate,
            s=45,
            zorder=3,
        )
    for row, _, y in points:
        number = trial_number(str(row.trial.trial_id))
        ax.annotate(
            f"{number:02d}" if number is not None else str(row.trial.trial_id),
            (position[id(row)], float(y)),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
        if row.best:
            ax.scatter(
                [position[id(row)]],
                [float(y)],
                s=200,
                facecolors="none",
                edgecolors="black",
                linewidths=1.5,
                zorder=4,
                label="best",
            )
    ax.margins(x=0.1, y=0.12)
    ax.set_xlabel(param)
    ax.set_ylabel(f"{metric} (last reported)")
    ax.set_title(f"{param} vs {metric}")
    ax.grid(alpha=0.3)
    if points:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def _file_key(param: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", param).strip("_") or "param"


def sweep_plots(sweep: SweepOutcome, asha: AshaConfig, directory: str) -> dict[str, str]:
    """Every plot of a sweep, as ``{file name: path}``: sweep_curves.png, asha_rungs.png and one
    param_<key>.png per swept parameter."""
    milestones = milestones_of(asha)
    rows = trial_rows(sweep, asha)
    metric = sweep.metric or "val_accuracy"
    others = [m for m in ("val_accuracy", "val_rmse", "val_loss") if m != metric]
    plots = {
        "sweep_curves.png": save(
            sweep_curves_figure(rows, asha.max_t, milestones, metrics=(metric, *others)),
            os.path.join(directory, "sweep_curves.png"),
        ),
        "asha_rungs.png": save(
            asha_rungs_figure(
                rows, asha.max_t, milestones, sweep.epochs_spent, sweep.epochs_budget
            ),
            os.path.join(directory, "asha_rungs.png"),
        ),
    }
    for param in swept_params(row.trial for row in rows):
        name = f"param_{_file_key(param)}.png"
        plots[name] = save(param_metric_figure(rows, param, metric), os.path.join(directory, name))
    return plots
