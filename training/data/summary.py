"""One pass over the rows, batch by batch on the workers: each batch becomes a tiny summary
(split and class counts, missing labels, non-finite values, train moments of the features and of
a numeric label) that the driver adds up. Class counts stop at ``MAX_CLASSES`` distinct values:
a continuous label (regression) has as many values as rows.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from training.config import SplitConfig
from training.data.fitting import TableFit, table_partial
from training.data.rows import (
    assign_splits,
    feature_matrix,
    hash_rows,
    labels_of,
    missing_labels,
    raw_values,
)
from training.data.schema import Plan
from training.data.task import MAX_CLASSES, label_kind
from training.errors import DataValidationError
from training.manifest import SPLITS
from training.model.trainflow_pyfunc.transform import TransformError, numbers


def summarise(batch: pd.DataFrame, plan: Plan, split: SplitConfig) -> dict[str, np.ndarray]:
    """A tiny per-batch summary: split/class counts, null labels, non-finite values, train stats."""
    try:
        summary = batch_summary(batch, plan, split) if len(batch) else {"rows": 0}
    except (DataValidationError, TransformError) as exc:
        # Carried as data: Ray would wrap a raised exception and lose its type.
        summary = {"error": str(exc)}
    return {"summary": np.array([pickle.dumps(summary)], dtype=object)}


def batch_summary(batch: pd.DataFrame, plan: Plan, split: SplitConfig) -> dict[str, Any]:
    """The summary of one non-empty batch (``summarise`` runs it on the workers)."""
    labels = labels_of(batch, plan.label)
    table = None
    if plan.image:
        raw = feature_matrix(batch, plan.features, plan.image)
        hashes = hash_rows(raw, labels, split.seed)
    else:
        hashes = hash_rows(raw_values(batch, plan.hash_roles), labels, split.seed)
        raw = numbers(batch, plan.features or [])
    splits = assign_splits(hashes, split)
    null = missing_labels(labels)
    if not plan.image:
        train = (splits == "train") & ~null
        table = table_partial(batch, plan.hash_roles, train, hashes, plan.date_formats)
    frame = pd.DataFrame({"split": splits[~null], "label": labels[~null].to_numpy()})
    counts: dict[str, dict[Any, int]] | None = {s: {} for s in SPLITS}
    if frame["label"].nunique() > MAX_CLASSES:
        counts = None  # a continuous label: its values are not classes worth counting
    else:
        for (s, value), n in frame.groupby(["split", "label"], sort=False).size().items():
            counts[s][value.item() if hasattr(value, "item") else value] = int(n)
    names = plan.features or [plan.image] * raw.shape[1]
    nonfinite = _count_by_name(names, (~np.isfinite(raw)).sum(axis=0))
    infinite = _count_by_name(names, np.isinf(raw).sum(axis=0))
    if table is None:
        train = raw[splits == "train"]
        mean = train.mean(axis=0) if len(train) else np.zeros(raw.shape[1])
        moments = (len(train), mean, ((train - mean) ** 2).sum(axis=0))
    else:
        moments = (0, 0.0, 0.0)  # a table's are per column, in its partial (gaps left out)
    return {
        "rows": len(batch),
        "width": raw.shape[1],
        "table": table,
        "infinite": infinite,
        "class_counts": counts,
        "split_rows": {s: int(n) for s, n in frame["split"].value_counts().items()},
        "null_labels": int(null.sum()),
        "nonfinite": nonfinite,
        "train": moments,
        **_label_summary(labels[~null], splits[~null]),
    }


def _count_by_name(names: list[str], counts: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in zip(names, counts.tolist(), strict=True):
        if n:
            out[name] = out.get(name, 0) + n
    return out


def _label_summary(labels: pd.Series, splits: np.ndarray) -> dict[str, Any]:
    """The label's kind, its infinite values, whether any has a fraction, train moments."""
    kind = label_kind(labels)
    out: dict[str, Any] = {"label_kind": kind, "inf_labels": 0, "fractional": False}
    if kind not in ("int", "float"):
        return out
    values = labels.to_numpy(dtype=np.float64, na_value=np.nan)
    finite = np.isfinite(values)
    train = values[finite & (splits == "train")]
    mean = float(train.mean()) if len(train) else 0.0
    out["inf_labels"] = int((~finite).sum())
    out["fractional"] = bool((values[finite] % 1 != 0).any())
    out["label_train"] = (len(train), mean, float(((train - mean) ** 2).sum()))
    return out


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
    class_counts: dict | None = None  # split -> label value -> rows; empty once many_values
    split_rows: dict | None = None  # split -> rows with a label
    many_values: bool = False  # more than MAX_CLASSES distinct labels: counting stopped
    null_labels: int = 0
    nonfinite: dict | None = None
    train: tuple = (0, 0.0, 0.0)
    label_kinds: set | None = None  # label_kind of each batch: bool, int, float, other
    inf_labels: int = 0
    fractional: bool = False
    label_train: tuple = (0, 0.0, 0.0)  # count, mean, M2 of a numeric label's train values
    infinite: dict | None = None  # numeric column -> rows with an infinite value
    table: TableFit | None = None  # a table's columns fitted on the train split

    @property
    def distinct_labels(self) -> int:
        """Distinct label values, or MAX_CLASSES + 1 once there were more."""
        if self.many_values:
            return MAX_CLASSES + 1
        return len({v for per_class in (self.class_counts or {}).values() for v in per_class})

    def add(self, part: dict[str, Any]) -> None:
        """Add one batch's summary; a batch's validation error is raised here, on the driver."""
        if "error" in part:
            raise DataValidationError(part["error"])
        if part["rows"] == 0:
            return
        self.rows += part["rows"]
        self.widths = (self.widths or set()) | {part["width"]}
        self.class_counts = self.class_counts or {s: {} for s in SPLITS}
        self.split_rows = self.split_rows or dict.fromkeys(SPLITS, 0)
        for s, n in part["split_rows"].items():
            self.split_rows[s] += n
        self.many_values = self.many_values or part["class_counts"] is None
        if not self.many_values:
            for s, per_class in part["class_counts"].items():
                for value, n in per_class.items():
                    self.class_counts[s][value] = self.class_counts[s].get(value, 0) + n
            self.many_values = self.distinct_labels > MAX_CLASSES
        if self.many_values:
            self.class_counts = {s: {} for s in SPLITS}
        self.label_kinds = (self.label_kinds or set()) | {part["label_kind"]}
        self.inf_labels += part["inf_labels"]
        self.fractional = self.fractional or part["fractional"]
        if "label_train" in part:
            self.label_train = _merge_moments(self.label_train, part["label_train"])
        self.null_labels += part["null_labels"]
        self.nonfinite = self.nonfinite or {}
        for name, n in part["nonfinite"].items():
            self.nonfinite[name] = self.nonfinite.get(name, 0) + n
        self.train = _merge_moments(self.train, part["train"])
        self.infinite = self.infinite or {}
        for name, n in part.get("infinite", {}).items():
            self.infinite[name] = self.infinite.get(name, 0) + n
        if part.get("table") is not None:
            self.table = self.table or TableFit(roles={})
            self.table.add(part["table"])
