"""The table steps of the one transform that are more than a cast: categories as integer codes
and datetimes as numbers. numpy and pandas only, vectorised (no Python per row), plain-data state.

A categorical column occupies one feature position holding its code as a float (exact in
float32): 0 other/unknown (rare in training, or never seen), 1 missing, 2.. the fitted
vocabulary, most frequent first. A datetime column occupies ``datetime_width(spec)``
positions: its year, then sin/cos of each of the spec's cycles (cyclical: December sits next to
January). A spec from before day-of-year was a cycle has no ``datetime_cycles`` and keeps its
month, weekday and hour; a spec from before formats has no ``datetime_formats`` and parses
dates as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

#: The codes every vocabulary reserves before its own values.
UNKNOWN, MISSING = 0, 1
RESERVED = 2
#: Each cycle a date can be read as: (pandas ``.dt`` field, period, first value).
_CYCLE_FIELDS = {
    "month": ("month", 12, 1),
    "weekday": ("dayofweek", 7, 0),
    "hour": ("hour", 24, 0),
    # 365.25: Dec 31 lands next to Jan 1 in leap years and common years alike.
    "dayofyear": ("dayofyear", 365.25, 1),
}
#: The cycles of a spec that names none (every model registered before day of year).
OLD_CYCLES = ("month", "weekday", "hour")
#: The cycles a new spec records: the seasons need day of year.
CYCLES = (*OLD_CYCLES, "dayofyear")
#: The format name ``datetime_formats`` holds for ISO 8601 (date, optional time and zone).
ISO = "ISO8601"


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


def datetime_cycles(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The cycles a spec's datetime columns are read as (an older spec's, where it names none)."""
    return tuple(spec.get("datetime_cycles") or OLD_CYCLES)


def datetime_width(spec: Mapping[str, Any]) -> int:
    """Positions per datetime column: its year, then a (sin, cos) pair per cycle."""
    return 1 + 2 * len(datetime_cycles(spec))


def parse_datetimes(series: pd.Series, column: str, fmt: str | None = None) -> pd.Series:
    """A timestamp, date or text column as UTC datetimes (missing stays NaT). With ``fmt`` (the
    format fitted on training) text that does not fit is a gap; without one (a declared column,
    or a spec from before formats) text that is not a date is one error naming the column."""
    if isinstance(series.dtype, pd.ArrowDtype):
        series = series.astype(object)
    if fmt is not None:
        return parse_as(series, fmt)
    parsed = pd.to_datetime(series, errors="coerce", utc=True, format="mixed")
    bad = parsed.isna() & series.notna()
    if bad.any():
        raise TransformError(
            f"datetime column {column!r} holds a value that is not a date (e.g. "
            f"{series[bad].iloc[0]!r}); fix it, or declare the column categorical or ignore "
            "in data.columns"
        )
    return parsed


def parse_as(series: pd.Series, fmt: str) -> pd.Series:
    """Values under one format as UTC datetimes; a value that does not fit is NaT (a gap)."""
    if pd.api.types.is_datetime64_any_dtype(series):
        return pd.to_datetime(series, utc=True)  # already instants: the format is for text
    if pd.api.types.is_numeric_dtype(series):
        series = category_keys(series)  # 20120101 stored as a number reads as its digits
    # As text: a JSON request may mix numbers and strings in one column.
    return pd.to_datetime(series.astype("string"), format=fmt, errors="coerce", utc=True)


def datetime_parts(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """Year and the cycles (sin, cos) of each datetime column (float64 [n, datetime_width per
    column]); a missing or unparsable date gets the train split's mean year and 0 for its
    cycles."""
    parts = []
    fill = spec.get("datetime_years") or {}
    formats = spec.get("datetime_formats") or {}
    cycles = [_CYCLE_FIELDS[name] for name in datetime_cycles(spec)]
    for column in columns:
        parsed = parse_datetimes(frame[column], column, formats.get(column))
        gap = parsed.isna().to_numpy()
        year = parsed.dt.year.to_numpy(dtype=np.float64, na_value=np.nan)
        parts.append(np.where(gap, float(fill.get(column, 0.0)), year))
        for field, period, first in cycles:
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
    dates = datetime_width(spec) * len(spec.get("datetime_columns") or [])
    text = int(spec.get("text_features") or 0) * len(spec.get("text_columns") or [])
    return [0] * width + cats + [0] * (dates + text)
