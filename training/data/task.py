"""Classification or regression: ``data.task``, or what the label column looks like.

auto: strings and bools are classes; integers are classes up to ``MAX_CLASSES`` distinct
values; floats are numbers to predict (regression) once they hold a fractional value or more
than ``FLOAT_CLASSES_MAX`` distinct values (a whole-numbered float column with a few values is
a class label a CSV or a null turned into floats).
"""

from __future__ import annotations

import pandas as pd

#: Distinct labels a classifier may have; more, and the summary stops counting them.
MAX_CLASSES = 1000
#: A float label with at most this many distinct whole values is a class label under auto.
FLOAT_CLASSES_MAX = 20

CLASSIFICATION = "classification"
REGRESSION = "regression"


def label_kind(labels: pd.Series) -> str:
    """``bool``, ``int``, ``float`` or ``other`` (strings, objects) for a label column."""
    dtype = labels.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_numeric_dtype(dtype):
        return "float"
    return "other"


def choose_task(
    requested: str, label: str, kinds: set[str], distinct: int, fractional: bool
) -> tuple[str, str]:
    """(task, why) for ``data.task`` = ``requested`` and the label's summary: the kinds of its
    batches, its distinct values (counted up to ``MAX_CLASSES + 1``) and whether any value
    has a fraction."""
    many = f"more than {MAX_CLASSES}" if distinct > MAX_CLASSES else str(distinct)
    if requested != "auto":
        return requested, f"data.task={requested}"
    if kinds & {"other", "bool"}:
        what = "strings" if "other" in kinds else "bools"
        return CLASSIFICATION, f"auto: label {label!r} holds {what}, {many} classes"
    if kinds == {"int"}:
        if distinct > MAX_CLASSES:
            return REGRESSION, f"auto: integer label {label!r} with {many} distinct values"
        return CLASSIFICATION, f"auto: integer label {label!r} with {many} classes"
    if fractional or distinct > FLOAT_CLASSES_MAX:
        return REGRESSION, f"auto: float label {label!r} with {many} distinct values"
    return CLASSIFICATION, (
        f"auto: float label {label!r} with only {many} distinct whole values, taken as classes"
    )
