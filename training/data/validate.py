"""What the summary of the whole input decides: the task (classification or regression), refusing
data it cannot learn from, and the classes and normalisation (train statistics) of every row."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from training.config import DataConfig
from training.data.columns import check_image_shape, ragged
from training.data.diagnose import locate_missing_labels
from training.data.fitted import table_state
from training.data.roles import REASONS
from training.data.schema import Plan
from training.data.summary import Stats
from training.data.task import MAX_CLASSES, REGRESSION, choose_task
from training.errors import DataValidationError
from training.manifest import SPLITS, FeatureSpec

__all__ = ["MAX_CLASSES", "feature_spec", "left_out", "missing_labels_error", "validate"]


def _sorted_classes(values: set) -> list[Any]:
    # Class i is the i-th value: a stable order for every run over the same data.
    try:
        return sorted(values)
    except TypeError:  # mixed types: order by type name, then value text
        return sorted(values, key=lambda v: (type(v).__name__, str(v)))


def validate(
    stats: Stats, data: DataConfig, plan: Plan, files: list[str], endpoint_url: str | None = None
) -> tuple[str, str, list[Any]]:
    """Raise on unusable data; return the task, why it was chosen, and the sorted classes
    (none for a regression)."""
    _check_values(stats, data, plan, files, endpoint_url)
    label = data.label_column
    task, reason = choose_task(
        data.task, label, stats.label_kinds, stats.distinct_labels, stats.fractional
    )
    if stats.inf_labels:
        raise DataValidationError(
            f"{stats.inf_labels} of {stats.rows} rows have an infinite value in label column "
            f"{label!r}; drop or fix those rows before training"
        )
    for s in SPLITS:
        if not stats.split_rows[s]:
            raise DataValidationError(
                f"the {s} split got no rows out of {stats.rows}; add rows or raise data.split.val"
                "/test"
            )
    if task == "causal_lm":  # a language model learns the text itself: the label is not used
        return task, reason, []
    if task == REGRESSION:
        _check_regression(stats, data)
        return task, reason, []
    if stats.many_values:
        raise DataValidationError(
            f"label column {label!r} has more than {MAX_CLASSES} distinct values; it is not a "
            "class label: set data.label_column to the class column, or data.task=regression "
            "to predict the number"
        )
    totals: dict[Any, int] = {}
    for per_class in stats.class_counts.values():
        for value, n in per_class.items():
            totals[value] = totals.get(value, 0) + n
    _check_classes(totals, data)
    return task, reason, _sorted_classes(set(totals))


def _check_regression(stats: Stats, data: DataConfig) -> None:
    """A number in every label, and numbers that vary across the training split."""
    label = data.label_column
    if not stats.label_kinds <= {"int", "float"}:
        kinds = sorted(stats.label_kinds - {"int", "float"})
        raise DataValidationError(
            f"label column {label!r} holds {'/'.join(kinds)} values, not numbers; a regression "
            "predicts a number: set data.task=classification or convert the label to numbers"
        )
    n_train, _, m2 = stats.label_train
    if n_train < 2 or m2 <= 0:
        raise DataValidationError(
            f"label column {label!r} has the same value in every training row; a regression "
            "needs labels that vary"
        )


def _check_values(
    stats: Stats, data: DataConfig, plan: Plan, files: list[str], endpoint_url: str | None
) -> None:
    """Rows there, every label set, every feature finite, one width that fits the image shape."""
    if stats.rows == 0:
        raise DataValidationError(
            f"the input has no rows ({len(files)} file(s): {files[:3]}); point data.source at "
            "data with rows"
        )
    if stats.null_labels and data.missing_label == "error":
        raise missing_labels_error(stats.null_labels, stats.rows, files, plan, endpoint_url)
    if data.missing == "impute" and not plan.image:
        if stats.infinite:
            detail = ", ".join(f"{k!r}: {v}" for k, v in list(stats.infinite.items())[:10])
            raise DataValidationError(
                f"feature values are infinite ({detail}); drop or fix those rows, or leave the "
                "columns out (data.columns: {name: ignore})"
            )
    elif stats.nonfinite:
        detail = ", ".join(f"{k!r}: {v}" for k, v in list(stats.nonfinite.items())[:10])
        raise DataValidationError(
            f"feature values are NaN or infinite ({detail}); drop those rows, set "
            "data.missing=impute, or leave the columns out of data.feature_columns"
        )
    if len(stats.widths) > 1:
        raise ragged(plan.image, stats.widths)
    check_image_shape(data.image_shape, next(iter(stats.widths)), plan.image)


def missing_labels_error(
    missing: int, rows: int, files: list[str], plan: Plan, endpoint_url: str | None
) -> DataValidationError:
    """The error for ``missing`` of ``rows`` rows without a label, naming the first of them."""
    # Counted over the whole table (the summary pass, or the label column alone); the driver
    # finds the first one.
    first = locate_missing_labels(files, plan, endpoint_url)
    where = f" (the first in {first})" if first else ""
    return DataValidationError(
        f"{missing} of {rows} rows have no value in label column {plan.label!r}{where}; fill "
        "those rows, or set data.missing_label: drop to train without them"
    )


def _check_classes(totals: dict[Any, int], data: DataConfig) -> None:
    """Between two and MAX_CLASSES classes, each with enough rows to reach every split."""
    label = data.label_column
    if len(totals) < 2:
        raise DataValidationError(
            f"label column {label!r} has a single value {list(totals)}; a classifier needs at "
            "least two classes"
        )
    smallest = min(data.split.val, data.split.test)
    need = math.ceil(1 / smallest - 1e-9)
    small = {v: n for v, n in totals.items() if n < need}
    if small:
        detail = ", ".join(f"class {v!r} has {n}" for v, n in list(small.items())[:10])
        raise DataValidationError(
            f"too few rows per class for the split ({detail}); with data.split.val="
            f"{data.split.val} and test={data.split.test} each class needs at least {need} rows. "
            "Add rows, drop those classes, or raise data.split.val/test"
        )


def feature_spec(
    stats: Stats, data: DataConfig, plan: Plan, classes: list[Any], task: str = "classification"
) -> FeatureSpec:
    """The features' shape and the train split's mean and std, to normalise every row with (and
    a regression's label's)."""
    label_mean, label_std = 0.0, 1.0
    if task == REGRESSION:
        n_label, label_mean, label_m2 = stats.label_train
        label_std = math.sqrt(label_m2 / n_label)
    if stats.table is not None:
        return _table_spec(stats, data, plan, classes, task, (label_mean, label_std))
    n_train, mean, m2 = stats.train
    std = np.sqrt(m2 / n_train)
    std = np.where(std > 0, std, 1.0)  # constant columns: leave them centred, not divided by 0
    width = next(iter(stats.widths))
    return FeatureSpec(
        label_column=data.label_column,
        classes=classes,
        input_shape=list(data.image_shape) if data.image_shape else [width],
        mean=[float(v) for v in np.broadcast_to(mean, (width,))],
        std=[float(v) for v in np.broadcast_to(std, (width,))],
        feature_columns=plan.features,
        image_column=plan.image,
        task=task,
        label_mean=float(label_mean),
        label_std=float(label_std),
    )


def _table_spec(
    stats: Stats, data: DataConfig, plan: Plan, classes: list[Any], task: str, label: tuple
) -> FeatureSpec:
    """A table's spec: its fitted state (``training.data.fitted``) and per-position stats."""
    state = table_state(stats.table, data, plan)
    return FeatureSpec(
        label_column=data.label_column,
        classes=classes,
        input_shape=[len(state.mean)],
        mean=state.mean,
        std=state.std,
        feature_columns=plan.features,
        task=task,
        label_mean=float(label[0]),
        label_std=float(label[1]),
        **state.fields,
    )


def left_out(spec: FeatureSpec, plan: Plan) -> dict[str, str]:
    """A table's columns not used, each with the reason: found id-like or declared ignore (the
    spec's roles), or of a type no role reads (the plan's)."""
    ignored = {c: REASONS.get(r, r) for c, r in spec.column_roles.items() if r in REASONS}
    ignored.update(plan.ignored)
    return ignored
