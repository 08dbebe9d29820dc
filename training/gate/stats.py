"""The gate's statistics: two models' predictions on the same rows, compared. Pure numpy.

:func:`paired_bootstrap` resamples the rows (the same resample for both models, so the
difference is paired) and computes every resample's metric at once, vectorised;
:func:`slice_drops` finds the slices (a class, a value of a column) where the challenger is
worse than the champion. No MLflow, no I/O: :mod:`training.gate.policy` decides with them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from training.metrics import direction, gain


@dataclass(frozen=True)
class Paired:
    """Both models' metric on the same rows, the improvement (challenger over champion, in the
    metric's direction: positive is better) and its bootstrap interval."""

    champion: float
    challenger: float
    difference: float
    low: float
    high: float
    confidence: float
    rows: int


def _name(metric: str) -> str:
    return metric.split("_", 1)[-1] if metric.startswith(("test_", "val_")) else metric


def resampled_metric(
    metric: str, labels: np.ndarray, predicted: np.ndarray, index: np.ndarray
) -> np.ndarray:
    """``metric`` of ``predicted`` against ``labels`` on each row set of ``index`` (shape
    ``(resamples, rows)``), one value per resample. Accuracy, macro-F1 (classes are the
    label values), RMSE, MAE, R²."""
    name = _name(metric)
    y, p = labels[index], predicted[index]
    if name == "accuracy":
        return (y == p).mean(axis=1)
    if name == "macro_f1":
        return _macro_f1(labels, predicted, index)
    y, p = y.astype(np.float64), p.astype(np.float64)
    if name == "rmse":
        return np.sqrt(np.square(p - y).mean(axis=1))
    if name == "mae":
        return np.abs(p - y).mean(axis=1)
    if name == "r2":
        sse = np.square(p - y).sum(axis=1)
        sst = np.square(y - y.mean(axis=1, keepdims=True)).sum(axis=1)
        return np.where(sst > 0, 1.0 - sse / np.where(sst > 0, sst, 1.0), 0.0)
    raise ValueError(f"the gate cannot compare on {metric!r} from predictions")


def _macro_f1(labels: np.ndarray, predicted: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Mean F1 over the classes present in each resample (as the evaluation's macro-F1):
    F1 = 2 TP / (true + predicted) per class."""
    classes = np.unique(labels)
    total = np.zeros(index.shape[0])
    present = np.zeros(index.shape[0])
    for value in classes:
        is_true, is_pred = labels == value, predicted == value
        true = is_true[index].sum(axis=1)
        pred = is_pred[index].sum(axis=1)
        hits = (is_true & is_pred)[index].sum(axis=1)
        denom = true + pred
        total += np.divide(2.0 * hits, denom, out=np.zeros(len(denom)), where=denom > 0)
        present += true > 0
    return np.divide(total, present, out=np.zeros(len(total)), where=present > 0)


def metric_of(metric: str, labels, predicted) -> float:
    """``metric`` on all rows."""
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    return float(resampled_metric(metric, labels, predicted, np.arange(len(labels))[None, :])[0])


def paired_bootstrap(
    metric: str,
    labels,
    challenger,
    champion,
    confidence: float = 0.95,
    samples: int = 1000,
    seed: int = 0,
) -> Paired:
    """The challenger's improvement over the champion on the same rows and its percentile
    interval from ``samples`` paired resamples of the rows (seeded: the same inputs give the
    same interval)."""
    labels, challenger, champion = (np.asarray(a) for a in (labels, challenger, champion))
    rows = len(labels)
    if rows == 0 or len(challenger) != rows or len(champion) != rows:
        raise ValueError("both models' predictions must cover the same, non-empty rows")
    mode = direction(metric)
    new, old = metric_of(metric, labels, challenger), metric_of(metric, labels, champion)
    index = np.random.default_rng(seed).integers(0, rows, size=(samples, rows))
    gains = gain(
        resampled_metric(metric, labels, challenger, index),
        resampled_metric(metric, labels, champion, index),
        mode,
    )
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(gains, [tail, 1.0 - tail])
    return Paired(old, new, gain(new, old, mode), float(low), float(high), confidence, rows)


def slice_drops(
    metric: str,
    labels,
    challenger,
    champion,
    columns: Mapping[str, Sequence] | None = None,
    max_drop: float | None = 0.1,
    min_rows: int = 1,
) -> list[dict]:
    """Every slice where the challenger does worse than the champion by more than
    ``max_drop``: per class the recall of a classifier (``metric`` is accuracy or macro-F1), and
    per value of each of ``columns`` (the raw table's column values, row by row) the gate's
    metric. Slices under ``min_rows`` rows are too small to judge. ``max_drop`` None: off."""
    if max_drop is None:
        return []
    labels, challenger, champion = (np.asarray(a) for a in (labels, challenger, champion))
    groups: list[tuple[str, np.ndarray, str]] = []
    if _name(metric) in ("accuracy", "macro_f1"):
        groups += [(f"class={v}", labels == v, "accuracy") for v in np.unique(labels)]
    for column, values in (columns or {}).items():
        values = np.asarray(values, dtype=object)
        for value in sorted({str(v) for v in values}):
            groups.append((f"{column}={value}", values.astype(str) == value, metric))
    dropped = []
    for name, rows, measured in groups:
        if rows.sum() < max(min_rows, 1):
            continue
        old = metric_of(measured, labels[rows], champion[rows])
        new = metric_of(measured, labels[rows], challenger[rows])
        change = gain(new, old, direction(measured))
        if change < -max_drop:
            label = "recall" if measured != metric else _name(metric)
            dropped.append(
                {
                    "slice": name,
                    "metric": label,
                    "rows": int(rows.sum()),
                    "champion": old,
                    "challenger": new,
                    "change": change,
                }
            )
    return dropped
