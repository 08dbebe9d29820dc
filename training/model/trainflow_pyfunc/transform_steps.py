"""The table steps of the one transform that are more than a cast: categories as integer codes
and datetimes as numbers. numpy and pandas only, vectorised (no Python per row), plain-data state.

A categorical column occupies one feature position holding its code as a float (exact in
float32): 0 other/unknown (rare in training, or never seen), 1 missing, 2.. the fitted
vocabulary, most frequent first. A datetime column occupies ``DATETIME_WIDTH`` positions: its
year, then sin/cos of month, weekday and hour (cyclical: December sits next to January).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

#: The codes every vocabulary reserves before its own values.
UNKNOWN, MISSING = 0, 1
RESERVED = 2
#: Positions per datetime column: year, then (sin, cos) of month, weekday, hour.
DATETIME_WIDTH = 7
_CYCLES = (("month", 12, 1), ("weekday", 7, 0), ("hour", 24, 0))


class TransformError(ValueError):
    """Raw rows the transform cannot turn into tensors; the message names the column."""


def category_keys(series: pd.Series) -> pd.Series:
    """A column's values as the text its vocabulary holds (missing stays missing): the same key
    for 3, 3.0 and "3", so an integer column read by CSV or parquet, with gaps or not, agrees."""
    if pd.api.types.is_bool_dtype(series):
        return series.astype("string")
    if pd.api.types.is_numeric_dtype(series):
        # As float64 numpy (an Arrow-backed int column, as Ray Data hands it, has no ``%``).
        values = pd.Series(series.to_numpy(dtype=np.float64, na_value=np.nan), index=series.index)
        whole = values.notna() & (values % 1 == 0)
        keys = values.astype("string")
        keys[whole] = values[whole].astype("int64").astype("string")
        keys[values.isna()] = pd.NA
        return keys
    return series.astype("string")


def categorical_codes(
    frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]
) -> np.ndarray:
    """Each categorical column's code per row (float64 [n, len(columns)])."""
    out = np.empty((len(frame), len(columns)), dtype=np.float64)
    for i, column in enumerate(columns):
        keys = category_keys(frame[column])
        found = pd.Index(spec["categories"][column]).get_indexer(keys)
        codes = np.where(found >= 0, found + RESERVED, UNKNOWN)
        out[:, i] = np.where(keys.isna().to_numpy(), MISSING, codes)
    return out


def parse_datetimes(series: pd.Series, column: str) -> pd.Series:
    """A timestamp, date or text column as UTC datetimes (missing stays NaT); text that is not a
    date is one error naming the column and an example."""
    if isinstance(series.dtype, pd.ArrowDtype):
        series = series.astype(object)
    parsed = pd.to_datetime(series, errors="coerce", utc=True, format="mixed")
    bad = parsed.isna() & series.notna()
    if bad.any():
        raise TransformError(
            f"datetime column {column!r} holds a value that is not a date (e.g. "
            f"{series[bad].iloc[0]!r}); fix it, or declare the column categorical or ignore "
            "in data.columns"
        )
    return parsed


def datetime_parts(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """Year and cyclical month/weekday/hour of each datetime column (float64 [n, 7 per column]);
    a missing date gets the train split's mean year and 0 for its cycles."""
    parts = []
    fill = spec.get("datetime_years") or {}
    for column in columns:
        parsed = parse_datetimes(frame[column], column)
        gap = parsed.isna().to_numpy()
        year = parsed.dt.year.to_numpy(dtype=np.float64, na_value=np.nan)
        parts.append(np.where(gap, float(fill.get(column, 0.0)), year))
        for part, period, first in _CYCLES:
            field = "dayofweek" if part == "weekday" else part
            value = getattr(parsed.dt, field).to_numpy(dtype=np.float64, na_value=np.nan)
            angle = 2 * np.pi * (value - first) / period
            parts.append(np.where(gap, 0.0, np.sin(angle)))
            parts.append(np.where(gap, 0.0, np.cos(angle)))
    return np.column_stack(parts) if parts else np.zeros((len(frame), 0))


def cardinalities(spec: Mapping[str, Any]) -> list[int]:
    """Per feature position: the number of codes of a categorical one, 0 for a number."""
    if spec.get("image_column"):
        return []
    width = len(spec.get("feature_columns") or []) + len(spec.get("indicator_columns") or [])
    cats = [len(v) + RESERVED for v in (spec.get("categories") or {}).values()]
    dates = DATETIME_WIDTH * len(spec.get("datetime_columns") or [])
    text = int(spec.get("text_features") or 0) * len(spec.get("text_columns") or [])
    return [0] * width + cats + [0] * (dates + text)
