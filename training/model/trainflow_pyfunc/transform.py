"""The one raw-table -> tensors transform: training applies it in Ray Data, the registered model
applies it to every request, so the network sees the same numbers in both.

It reads the feature spec as plain data (the ``FeatureSpec``'s dict, as the state file stores
it) and uses numpy and pandas only (Arrow columns through pandas' own ``.list`` accessor), so the
model still loads where trainflow is not installed.

The features are a row of *steps*, each a plain-data pair (kind, columns) read from the spec and
applied by the function registered for its kind (``transform_steps.py``): ``numeric`` columns as
float64 (a gap filled with the train median), ``missing`` 0/1 indicators of those gaps,
``categorical`` columns as one integer code each (0 other/unknown, 1 missing, 2.. the fitted
vocabulary), ``datetime`` columns as year and cyclical month/weekday/hour/day of year (parsed
by the format training found, where it found one), ``text`` columns as a hashed bag of word
and character n-grams (``text_features.py``), an ``image`` column of
equal-length arrays flattened (or of encoded PNG/JPEG bytes, decoded and resized as training's
image reader did). Their matrix is then checked finite and normalised by the train split's
mean and std (a categorical code and a hashed text position have mean 0, std 1: they pass
through unchanged). A new kind of column is one more step, not a second path. A Hugging Face
model's ``tokens`` step (``tokens.py``) is the one step whose rows differ in length: its token
ids are not normalised, and each batch is padded where it is made.

Every refusal is a :class:`TransformError` naming the column: training raises it as a
``DataValidationError``, the served model as MLflow's HTTP 400.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from .images import ENCODED, decode, unreadable
from .prompts import row_ids, token_columns
from .text_features import hashed_text, text_width
from .tokens import tokens_state
from .transform_steps import TransformError, categorical_codes, datetime_parts, datetime_width

#: The keys of a transformed batch: the network's input and, with labels, its target.
FEATURES = "features"
LABEL = "label"


def input_columns(spec: Mapping[str, Any]) -> list[str]:
    """The raw columns the features are read from, in order (each once)."""
    return input_columns_of_steps(feature_steps(spec))


def input_columns_of_steps(steps: list[tuple[str, list[str]]]) -> list[str]:
    """The distinct raw columns a row of steps reads, in order."""
    return list(dict.fromkeys(column for _, columns in steps for column in columns))


def feature_steps(spec: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """The spec's feature steps, in feature order: (kind, the raw columns it reads)."""
    tokens = tokens_state(spec)
    if tokens:
        return [("tokens", token_columns(tokens))]
    if spec.get("image_column"):
        return [("image", [spec["image_column"]])]
    steps = [("numeric", list(spec.get("feature_columns") or []))]
    for kind, key in (
        ("missing", "indicator_columns"),
        ("categorical", "categories"),
        ("datetime", "datetime_columns"),
        ("text", "text_columns"),
    ):
        if spec.get(key):
            steps.append((kind, list(spec[key])))
    return steps


def check_columns(frame: pd.DataFrame, spec: Mapping[str, Any]) -> None:
    """Every column the features are read from is in the frame."""
    wanted = input_columns(spec)
    present = set(frame.columns)  # an image's pixels as columns can be thousands of names
    missing = [c for c in wanted if c not in present]
    if missing:
        raise TransformError(
            f"the input lacks column(s) {missing[:10]}; the model reads {wanted[:10]}"
        )


def numbers(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Numeric columns -> float64 [n, len(columns)], gaps as NaN; text is one error naming the
    column and an example value."""
    try:
        return frame[columns].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):
        # Checked only on failure: an object column of numbers (decimals) converts fine.
        for column in columns:
            converted = pd.to_numeric(frame[column], errors="coerce")
            bad = converted.isna() & frame[column].notna()
            if bad.any():
                example = frame[column][bad].iloc[0]
                raise TransformError(
                    f"column {column!r} is numeric but holds text (e.g. {example!r}); fix "
                    f"the value, or declare it data.columns.{column}: categorical"
                ) from None
        return frame[columns].apply(pd.to_numeric).to_numpy(dtype=np.float64, na_value=np.nan)


def _numeric(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """Numbers, a gap filled with the column's train median where the spec has medians."""
    raw = numbers(frame, columns)
    medians = spec.get("medians")
    if medians:
        gaps = np.isnan(raw)
        if gaps.any():  # vectorised and skipped when clean: the digits path stays as fast
            raw = np.where(gaps, np.asarray(medians, dtype=np.float64), raw)
    return raw


def _missing(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """1.0 where a numeric column had a gap, else 0.0."""
    return np.isnan(numbers(frame, columns)).astype(np.float64)


def _ragged(column: str, lengths: set[int]) -> TransformError:
    return TransformError(
        f"column {column!r} has rows of different lengths {sorted(lengths)[:5]}; every row "
        "needs the same number of values"
    )


def _empty_rows(column: str, count: int) -> TransformError:
    return TransformError(
        f"column {column!r} has {count} empty rows; every row needs an array (drop or fill them)"
    )


def _arrow_lists(series: pd.Series, column: str) -> np.ndarray:
    """An Arrow list, large list or fixed-size list column -> float64 [n, width]."""
    if series.isna().any():
        raise _empty_rows(column, int(series.isna().sum()))
    lengths = set(series.list.len().astype("int64").tolist())
    if len(lengths) > 1:
        raise _ragged(column, lengths)
    width = lengths.pop() if lengths else 0
    flat = series.list.flatten().to_numpy(dtype=np.float64, na_value=np.nan)
    return flat.reshape(len(series), width)


def _image(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """An image column (Arrow lists, a tensor column or arrays) -> float64 [n, width]."""
    (column,) = columns
    series = frame[column]
    if isinstance(series.dtype, pd.ArrowDtype) and series.dtype.type is list:
        return _arrow_lists(series, column)
    values = series.to_numpy()
    if values.dtype != object and values.ndim >= 2:  # a tensor extension column
        return values.reshape(len(values), -1).astype(np.float64)
    empty = sum(v is None or (np.ndim(v) == 0 and pd.isna(v)) for v in values)
    if empty:
        raise _empty_rows(column, empty)
    if len(values) and isinstance(values[0], ENCODED):
        return _decoded(values, column, spec)
    rows = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        raise _ragged(column, lengths)
    return np.stack(rows) if rows else np.zeros((0, 0))


def _decoded(values: np.ndarray, column: str, spec: Mapping[str, Any]) -> np.ndarray:
    """Encoded image files (PNG, JPEG bytes) -> float64 [n, C*H*W], decoded and resized as
    training's image reader did (``images.decode``)."""
    if "input_shape" not in spec:
        raise TransformError(f"column {column!r} holds encoded images but no image shape is known")
    shape = spec["input_shape"]
    rows = []
    for index, value in enumerate(values):
        try:
            rows.append(decode(value, shape))
        except (OSError, ValueError, TypeError) as exc:
            raise TransformError(
                f"column {column!r} row {index} is not a readable image: {unreadable(exc)}; send "
                "PNG or JPEG bytes (base64 text in JSON), or arrays"
            ) from None
    return np.stack(rows).astype(np.float64)


#: What each kind of step does to its columns: the frame -> float64 [n, its width].
STEPS: dict[str, Callable[[pd.DataFrame, list[str], Mapping[str, Any]], np.ndarray]] = {
    "numeric": _numeric,
    "missing": _missing,
    "categorical": categorical_codes,
    "datetime": datetime_parts,
    "image": _image,
    "text": hashed_text,
    "tokens": row_ids,  # an object array [n] of int32 ids per row, not a matrix
}


def raw_matrix(frame: pd.DataFrame, spec: Mapping[str, Any]) -> np.ndarray:
    """Raw rows -> float64 [n, width], before normalisation (NaN kept: the caller decides); a
    text's token ids: one int32 array per row.

    ``spec`` needs only the columns to read; with ``input_shape`` the width is checked too.
    """
    check_columns(frame, spec)
    parts = [STEPS[kind](frame, columns, spec) for kind, columns in feature_steps(spec)]
    raw = parts[0] if len(parts) == 1 else np.hstack(parts)
    if "input_shape" not in spec or tokens_state(spec):
        return raw
    width = math.prod(spec["input_shape"])
    if len(raw) == 0:  # an empty block: an array column cannot tell its width
        return raw.reshape(0, width)
    if raw.shape[1] != width:
        raise TransformError(
            f"column(s) {input_columns(spec)[:10]} give {raw.shape[1]} feature values per row but "
            f"the model expects {width} (input_shape {list(spec['input_shape'])}); use data "
            "shaped like the training data"
        )
    return raw


def _check_finite(raw: np.ndarray, spec: Mapping[str, Any]) -> None:
    finite = np.isfinite(raw)
    if finite.all():
        return
    if spec.get("image_column"):  # rows, not pixels
        bad = {spec["image_column"]: int((~finite).any(axis=1).sum())}
    else:
        counts = (~finite).sum(axis=0).tolist()
        names = position_names(spec)
        bad: dict[str, int] = {}
        for name, n in zip(names, counts, strict=True):
            if n:
                bad[name] = bad.get(name, 0) + n
    detail = ", ".join(f"{c!r}: {n} rows" for c, n in list(bad.items())[:10])
    raise TransformError(
        f"NaN or infinite values in column(s) {list(bad)[:10]} ({detail}); drop or fill those rows"
    )


def position_names(spec: Mapping[str, Any]) -> list[str]:
    """The raw column each feature position comes from (a table's; an image's is its column)."""
    if spec.get("image_column"):
        return [spec["image_column"]] * math.prod(spec["input_shape"])
    names: list[str] = []
    for kind, columns in feature_steps(spec):
        width = {"datetime": datetime_width(spec), "text": text_width(spec)}.get(kind, 1)
        names += [column for column in columns for _ in range(width)]
    return names


def normalise(raw: np.ndarray, spec: Mapping[str, Any]) -> np.ndarray:
    """The network's input (float32): minus the train mean, over the train std (a constant
    column, std 0, is only centred)."""
    _check_finite(raw, spec)
    mean = np.asarray(spec["mean"], dtype=np.float64)
    std = np.asarray(spec["std"], dtype=np.float64)
    return ((raw - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)


def is_regression(spec: Mapping[str, Any]) -> bool:
    """A regression predicts one number (older states, without a task, are classifiers)."""
    return spec.get("task", "classification") == "regression"


def targets(labels: pd.Series, spec: Mapping[str, Any]) -> np.ndarray:
    """The network's target: a class index (int64), or a regression's label (float32) minus the
    train label mean, over its std."""
    if is_regression(spec):
        values = labels.to_numpy(dtype=np.float64, na_value=np.nan)
        return label_units(values, spec).astype(np.float32)
    classes = list(spec["classes"])
    codes = pd.Index(classes).get_indexer(labels)
    if (codes < 0).any():
        unknown = sorted({str(v) for v in labels[codes < 0]})
        raise TransformError(
            f"label column {spec['label_column']!r} holds {int((codes < 0).sum())} rows with "
            f"values the model does not know ({unknown[:5]}); known classes: {classes[:20]}. "
            "Drop those rows or retrain with them"
        )
    return codes.astype(np.int64)


def label_units(values: np.ndarray, spec: Mapping[str, Any]) -> np.ndarray:
    """A regression's labels (float64) in the unit the network learns: minus the train label
    mean, over its std."""
    values = np.asarray(values, dtype=np.float64)
    return (values - spec.get("label_mean", 0.0)) / spec.get("label_std", 1.0)


def label_values(outputs: np.ndarray, spec: Mapping[str, Any]) -> np.ndarray:
    """A regression's outputs (float64) back in the label's own unit: the inverse of
    :func:`label_units`."""
    values = np.asarray(outputs, dtype=np.float64)
    return values * spec.get("label_std", 1.0) + spec.get("label_mean", 0.0)


def tensors(raw: np.ndarray, labels: pd.Series | None, spec: Mapping[str, Any]) -> dict:
    """A raw matrix (and the labels) -> {"features": float32 [n, width], "label": targets};
    token ids stay as they are (one array per row)."""
    out = {FEATURES: raw if tokens_state(spec) else normalise(raw, spec)}
    if labels is not None:
        out[LABEL] = targets(labels, spec)
    return out


def transform(frame: pd.DataFrame, spec: Mapping[str, Any], with_labels: bool) -> dict:
    """Raw rows -> {"features": float32 [n, width]} and, ``with_labels``, {"label": targets}."""
    labels = None
    if with_labels:
        column = spec["label_column"]
        if column not in frame.columns:
            raise TransformError(
                f"the input has no label column {column!r}; its columns are "
                f"{list(frame.columns)[:20]}"
            )
        labels = frame[column]
    return tensors(raw_matrix(frame, spec), labels, spec)
