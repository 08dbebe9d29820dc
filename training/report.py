"""Plots of an evaluation: PNG files written with matplotlib's Agg backend (no display needed).

matplotlib is imported inside each function, so importing this module costs nothing.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: no display, safe in worker threads and processes
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def confusion_matrix_png(matrix: Any, class_names: Sequence[str], path: str) -> str:
    """An annotated heatmap of ``matrix[true][predicted]`` counts; returns ``path``."""
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    n = len(class_names)
    if counts.shape != (n, n):
        raise ValueError(f"confusion matrix has shape {counts.shape}, expected ({n}, {n})")
    plt = _pyplot()
    size = max(4.0, 0.5 * n + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ticks = list(range(n))
    names = [str(c) for c in class_names]
    ax.set_xticks(ticks, labels=names, rotation=45 if max(map(len, names), default=0) > 3 else 0)
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
    return _save(fig, path)


def learning_curves_png(
    history: list[dict[str, Any]],
    path: str,
    metrics: Sequence[str] = ("train_loss", "val_loss", "val_accuracy"),
    step_key: str = "epoch",
) -> str:
    """Losses on the left axis, accuracies (names containing "acc") on a right axis, per epoch."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    right = None
    for k, metric in enumerate(metrics):
        points = [
            (row.get(step_key, i), float(row[metric]))
            for i, row in enumerate(history)
            if _is_number(row.get(metric))
        ]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        if "acc" in metric:
            right = right or ax.twinx()
            right.plot(xs, ys, marker="o", linestyle="--", label=metric, color=f"C{k}")
            right.set_ylabel("accuracy")
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
    return _save(fig, path)
