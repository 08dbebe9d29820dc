"""Plots of one model (PNG files): learning curves; a classifier's confusion matrix and
per-class scores; a regression's predicted-vs-actual and residuals.

A plot comes in a pair: ``*_figure`` builds and returns the matplotlib figure (the tests count its
series), ``*_png`` saves it and returns the path. matplotlib is imported inside :func:`pyplot`,
so importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from training.report.trials import is_number


def pyplot():
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: no display, safe in worker threads and processes
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str) -> str:
    """Write ``fig`` as a PNG at ``path`` (directories made), close it, return ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return path


def _tick_labels(names: Sequence[str]) -> dict[str, Any]:
    # Longer names than "123" are slanted so they do not overlap.
    return {"labels": names, "rotation": 45 if max(map(len, names), default=0) > 3 else 0}


def confusion_matrix_figure(matrix: Any, class_names: Sequence[str]):
    """An annotated heatmap of ``matrix[true][predicted]`` counts."""
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    n = len(class_names)
    if counts.shape != (n, n):
        raise ValueError(f"confusion matrix has shape {counts.shape}, expected ({n}, {n})")
    size = max(4.0, 0.5 * n + 2)
    fig, ax = pyplot().subplots(figsize=(size, size))
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ticks = list(range(n))
    names = [str(c) for c in class_names]
    ax.set_xticks(ticks, **_tick_labels(names))
    ax.set_yticks(ticks, labels=names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion matrix")
    threshold = counts.max() / 2 if counts.size else 0
    for i in range(n):
        for j in range(n):
            value = counts[i, j]
            text = f"{int(value)}" if value == int(value) else f"{value:.2f}"
            color = "white" if value > threshold else "black"
            ax.text(j, i, text, ha="center", va="center", color=color, fontsize=8)
    return fig


def confusion_matrix_png(matrix: Any, class_names: Sequence[str], path: str) -> str:
    return save(confusion_matrix_figure(matrix, class_names), path)


def learning_curves_figure(
    history: Sequence[Mapping[str, Any]],
    metrics: Sequence[str] = ("train_loss", "val_loss", "val_accuracy", "val_rmse"),
    step_key: str = "epoch",
):
    """Losses on the left axis, the other metrics (accuracy, a regression's RMSE in the
    label's unit) on a right axis, per epoch; metrics the history lacks are left out."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    right = None
    for k, metric in enumerate(metrics):
        points = [
            (row.get(step_key, i), float(row[metric]))
            for i, row in enumerate(history)
            if is_number(row.get(metric))
        ]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        if "loss" not in metric:
            right = right or ax.twinx()
            right.plot(xs, ys, marker="o", linestyle="--", label=metric, color=f"C{k}")
            right.set_ylabel(metric.removeprefix("val_"))
        else:
            ax.plot(xs, ys, marker="o", label=metric, color=f"C{k}")
    ax.set_xlabel(step_key)
    ax.set_ylabel("loss")
    ax.set_title("learning curves")
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        more_handles, more_labels = right.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        ax.legend(handles, labels, loc="best")
    ax.grid(alpha=0.3)
    return fig


def learning_curves_png(history: Sequence[Mapping[str, Any]], path: str) -> str:
    return save(learning_curves_figure(history), path)


def per_class_figure(per_class: Sequence[Mapping[str, Any]]):
    """Grouped bars: precision and recall of each class (rows of ``EvalResult.per_class``)."""
    import numpy as np

    names = [str(row["class"]) for row in per_class]
    x = np.arange(len(names))
    width = 0.4
    fig, ax = pyplot().subplots(figsize=(max(5.0, 0.6 * len(names) + 2), 4))
    for offset, key in ((-width / 2, "precision"), (width / 2, "recall")):
        ax.bar(x + offset, [float(row[key]) for row in per_class], width, label=key)
    ax.set_xticks(x, **_tick_labels(names))
    ax.set_ylim(0, 1.25)
    ax.set_xlabel("class")
    ax.set_ylabel("score")
    ax.set_title("per-class precision and recall (test split)")
    ax.legend(loc="upper right", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def per_class_png(per_class: Sequence[Mapping[str, Any]], path: str) -> str:
    return save(per_class_figure(per_class), path)


def evaluation_plots(
    per_class: Sequence[Mapping[str, Any]],
    confusion: Any,
    class_names: Sequence[str],
    directory: str,
) -> dict[str, str]:
    """confusion_matrix.png and per_class.png, as ``{file name: path}``."""
    return {
        "confusion_matrix.png": confusion_matrix_png(
            confusion, class_names, os.path.join(directory, "confusion_matrix.png")
        ),
        "per_class.png": per_class_png(per_class, os.path.join(directory, "per_class.png")),
    }


def predicted_vs_actual_figure(actual: Sequence[float], predicted: Sequence[float]):
    """A regression's predictions against the true values, with the diagonal of a perfect model."""
    fig, ax = pyplot().subplots(figsize=(5.5, 5))
    ax.scatter(actual, predicted, s=12, alpha=0.6)
    values = [*actual, *predicted]
    if values:
        low, high = min(values), max(values)
        ax.plot([low, high], [low, high], color="grey", linestyle="--", label="predicted = actual")
        ax.legend(loc="upper left")
    ax.set_xlabel("actual")
    ax.set_ylabel("predicted")
    ax.set_title("predicted vs actual (test split)")
    ax.grid(alpha=0.3)
    return fig


def residuals_figure(actual: Sequence[float], predicted: Sequence[float]):
    """Residuals (actual - predicted) against the prediction: a good model's scatter around 0."""
    residuals = [a - p for a, p in zip(actual, predicted, strict=True)]
    fig, ax = pyplot().subplots(figsize=(6, 4))
    ax.scatter(predicted, residuals, s=12, alpha=0.6)
    ax.axhline(0.0, color="grey", linestyle="--")
    ax.set_xlabel("predicted")
    ax.set_ylabel("residual (actual - predicted)")
    ax.set_title("residuals (test split)")
    ax.grid(alpha=0.3)
    return fig


def regression_plots(
    actual: Sequence[float], predicted: Sequence[float], directory: str
) -> dict[str, str]:
    """predicted_vs_actual.png and residuals.png, as ``{file name: path}``."""
    return {
        "predicted_vs_actual.png": save(
            predicted_vs_actual_figure(actual, predicted),
            os.path.join(directory, "predicted_vs_actual.png"),
        ),
        "residuals.png": save(
            residuals_figure(actual, predicted), os.path.join(directory, "residuals.png")
        ),
    }
