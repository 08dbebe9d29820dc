"""What the columns of the input must be: one set of checks, and one wording, for a file's schema
(on the driver), a batch of rows (on a worker) and the summary of them all."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from training.errors import DataValidationError

#: What a batch of rows is called in a message: a worker does not know the batch's file.
BATCH = "a batch of rows"
_BATCH_FIX = "Add them, or check data.feature_columns/image_column"


def require_columns(
    where: str,
    names: Sequence[str],
    *,
    label: str | None = None,
    image: str | None = None,
    features: Sequence[str] = (),
    origin: str = "",
    fix: str = _BATCH_FIX,
) -> None:
    """Raise a DataValidationError naming the first wanted column that ``names`` lacks.

    ``where`` is the file (or ``BATCH``); ``origin`` says where the feature columns come from
    and ``fix`` ends the message about them.
    """
    names = list(names)
    present = set(names)  # a batch of an image's pixels can have thousands of columns
    if label is not None and label not in present:
        raise DataValidationError(
            f"{where} has no label column {label!r}; its columns are {names[:20]}. "
            "Set data.label_column to the column to predict"
        )
    if image is not None and image not in present:
        raise DataValidationError(
            f"{where} has no image column {image!r}; its columns are {names[:20]}. "
            "Set data.image_column"
        )
    missing = [c for c in features if c not in present]
    if missing:
        raise DataValidationError(
            f"{where} lacks feature column(s) {missing}{origin}; its columns are {names[:20]}. "
            f"{fix}"
        )


def not_numeric(where: str, types: dict[str, str]) -> DataValidationError:
    """The error for feature columns (name -> type) that do not hold numbers."""
    return DataValidationError(
        f"feature column(s) {list(types)} are not numeric in {where} (types "
        f"{list(types.values())}); convert them to numbers or leave them out of "
        "data.feature_columns"
    )


def ragged(column: str | None, lengths: Iterable[int]) -> DataValidationError:
    """The error for an array column whose rows hold different numbers of values."""
    return DataValidationError(
        f"column {column!r} has rows of different lengths {sorted(lengths)[:5]}; every row "
        "needs the same number of values"
    )


def check_image_shape(shape: Sequence[int] | None, width: int, column: str | None = None) -> None:
    """data.image_shape, where set, must hold as many values as each row."""
    if shape is not None and math.prod(shape) != width:
        of = f" of {column!r}" if column else ""
        raise DataValidationError(
            f"data.image_shape {shape} holds {math.prod(shape)} values but each row{of} has "
            f"{width}; fix data.image_shape"
        )
