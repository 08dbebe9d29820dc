"""One pass over the rows, batch by batch on the workers: each batch becomes a tiny summary
(split and class counts, missing labels, non-finite values, train moments) that the driver adds up.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from training.config import SplitConfig
from training.data.rows import assign_splits, feature_matrix, hash_rows, labels_of, missing_labels
from training.data.schema import Plan
from training.errors import DataValidationError
from training.manifest import SPLITS


def summarise(batch: pd.DataFrame, plan: Plan, split: SplitConfig) -> dict[str, np.ndarray]:
    """A tiny per-batch summary: split/class counts, null labels, non-finite values, train stats."""
    try:
        summary = batch_summary(batch, plan, split) if len(batch) else {"rows": 0}
    except DataValidationError as exc:
        # Carried as data: Ray would wrap a raised exception and lose its type.
        summary = {"error": str(exc)}
    return {"summary": np.array([pickle.dumps(summary)], dtype=object)}


def batch_summary(batch: pd.DataFrame, plan: Plan, split: SplitConfig) -> dict[str, Any]:
    """The summary of one non-empty batch (``summarise`` runs it on the workers)."""
    raw = feature_matrix(batch, plan.features, plan.image)
    labels = labels_of(batch, plan.label)
    splits = assign_splits(hash_rows(raw, labels, split.seed), split)
    null = missing_labels(labels)
    frame = pd.DataFrame({"split": splits[~null], "label": labels[~null].to_numpy()})
    counts: dict[str, dict[Any, int]] = {s: {} for s in SPLITS}
    for (s, value), n in frame.groupby(["split", "label"], sort=False).size().items():
        counts[s][value.item() if hasattr(value, "item") else value] = int(n)
    bad = (~np.isfinite(raw)).sum(axis=0)
    names = plan.features or [plan.image] * raw.shape[1]
    nonfinite: dict[str, int] = {}
    for name, n in zip(names, bad.tolist(), strict=True):
        if n:
            nonfinite[name] = nonfinite.get(name, 0) + n
    train = raw[splits == "train"]
    mean = train.mean(axis=0) if len(train) else np.zeros(raw.shape[1])
    m2 = ((train - mean) ** 2).sum(axis=0)
    return {
        "rows": len(batch),
        "width": raw.shape[1],
        "class_counts": counts,
        "null_labels": int(null.sum()),
        "nonfinite": nonfinite,
        "train": (len(train), mean, m2),
    }


def _merge_moments(a: tuple, b: tuple) -> tuple:
    # Chan et al.'s parallel variance: exact for constant columns, unlike sum/sum-of-squares.
    (na, ma, m2a), (nb, mb, m2b) = a, b
    if na == 0:
        return b
    if nb == 0:
        return a
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta**2 * (na * nb / n)


@dataclass
class Stats:
    """The batch summaries added up on the driver: the whole input's counts and train moments."""

    rows: int = 0
    widths: set | None = None
    class_counts: dict | None = None
    null_labels: int = 0
    nonfinite: dict | None = None
    train: tuple = (0, 0.0, 0.0)

    def add(self, part: dict[str, Any]) -> None:
        """Add one batch's summary; a batch's validation error is raised here, on the driver."""
        if "error" in part:
            raise DataValidationError(part["error"])
        if part["rows"] == 0:
            return
        self.rows += part["rows"]
        self.widths = (self.widths or set()) | {part["width"]}
        self.class_counts = self.class_counts or {s: {} for s in SPLITS}
        for s, per_class in part["class_counts"].items():
            for value, n in per_class.items():
                self.class_counts[s][value] = self.class_counts[s].get(value, 0) + n
        self.null_labels += part["null_labels"]
        self.nonfinite = self.nonfinite or {}
        for name, n in part["nonfinite"].items():
            self.nonfinite[name] = self.nonfinite.get(name, 0) + n
        self.train = _merge_moments(self.train, part["train"])
