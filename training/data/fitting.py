"""Fitting a table's transform on the training split, streamed: each batch becomes a small
partial (per column: moments, gaps, a sample for the median, capped value counts, string shape)
that the driver adds up, then turns into the spec's plain-data state and the columns' roles.

Approximations, said plainly: a median is the median of a deterministic sample of at most
``SAMPLE_VALUES`` train values per column (those whose rows have the smallest row-hash keys, so
the sample does not depend on file order or batching); a vocabulary comes from value counts
capped at ``COUNT_CAP`` values per column (the least frequent are dropped batch by batch); a
string column's share of values made of words is read from each batch's ``WORDS_SAMPLE`` most
frequent values (``training.data.string_roles``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from training.data.dates import chosen_format, fitting_formats
from training.data.string_roles import ID_MIN_ROWS, Found, string_role, words_share
from training.model.trainflow_pyfunc.transform import numbers
from training.model.trainflow_pyfunc.transform_steps import category_keys, parse_datetimes

SAMPLE_VALUES = 10_000
COUNT_CAP = 10_000


def _moments(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, M2) per column of a float64 matrix, gaps (NaN) left out."""
    present = ~np.isnan(values)
    n = present.sum(axis=0).astype(np.float64)
    total = np.where(present, values, 0.0).sum(axis=0)
    mean = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
    m2 = np.where(present, (values - mean) ** 2, 0.0).sum(axis=0)
    return n, mean, m2


def merge_moments(a: tuple, b: tuple) -> tuple:
    """Chan et al.'s parallel variance, per column (counts may differ by column)."""
    (na, ma, m2a), (nb, mb, m2b) = (
        tuple(np.asarray(v, dtype=np.float64) for v in t) for t in (a, b)
    )
    n = na + nb
    delta = mb - ma
    share = np.divide(nb, n, out=np.zeros_like(n), where=n > 0)
    both = np.divide(na * nb, n, out=np.zeros_like(n), where=n > 0)
    return n, ma + delta * share, m2a + m2b + delta**2 * both


def _sample(values: np.ndarray, keys: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per column: (keys, values) of at most SAMPLE_VALUES present values with the smallest keys."""
    out = []
    for column in values.T:
        present = ~np.isnan(column)
        k, v = keys[present], column[present]
        if len(k) > SAMPLE_VALUES:
            keep = np.argpartition(k, SAMPLE_VALUES)[:SAMPLE_VALUES]
            k, v = k[keep], v[keep]
        out.append((k, v))
    return out


def _strings(keys: pd.Series, counts: pd.Series) -> dict[str, Any]:
    """How a string column looks in one batch: distinct values, lengths, spaces, words
    (``counts``: the batch's value counts)."""
    present = keys.dropna()
    if not len(present):
        return {"rows": 0, "distinct": 0, "length": 0.0, "spaces": 0.0, "words": 0.0}
    text = present.astype(str)
    return {
        "rows": len(present),
        "distinct": len(counts),
        "length": float(text.str.len().mean()),
        "spaces": float(text.str.contains(" ", regex=False).mean()),
        "words": words_share(counts),
    }


def _years(parsed: pd.Series) -> np.ndarray:
    return parsed.dt.year.to_numpy(dtype=np.float64, na_value=np.nan)[:, None]


def date_partial(values: pd.Series, formats: tuple[str, ...]) -> dict[str, tuple] | None:
    """A text column's train values as dates: per format under which every one parses, the
    moments of their years (None: no value in this batch, which rules no format out)."""
    fits = fitting_formats(values, formats)
    if fits is None:
        return None
    present = values.dropna()
    return {fmt: _moments(_years(parse_datetimes(present, "", fmt))) for fmt in fits}


def table_partial(
    batch: pd.DataFrame,
    roles: dict[str, str],
    train: np.ndarray,
    keys: np.ndarray,
    date_formats: dict[str, tuple[str, ...]] | None = None,
):
    """One batch's partial of the train rows (``train`` mask, ``keys`` the rows' hash keys);
    ``date_formats``: the formats each text column that may hold dates is tried under."""
    rows = batch[train]
    numeric = [c for c, r in roles.items() if r == "numeric"]
    values = numbers(rows, numeric)
    part: dict[str, Any] = {
        "numeric": _moments(values),
        "gaps": np.isnan(values).sum(axis=0),
        "sample": _sample(values, keys[train]),
        "categorical": {},
        "datetime": {},
        "dates": {},
    }
    for column in (c for c, r in roles.items() if r == "categorical"):
        found = category_keys(rows[column])
        counts = found.value_counts(dropna=True)
        shape = _strings(found, counts) if _is_text(batch[column]) else None
        kept = dict(counts.head(COUNT_CAP).items())
        part["categorical"][column] = (kept, int(found.isna().sum()), shape)
    for column in (c for c, r in roles.items() if r == "datetime"):
        parsed = parse_datetimes(batch[column], column)[train]
        years = parsed.dt.year.to_numpy(dtype=np.float64, na_value=np.nan)[:, None]
        part["datetime"][column] = _moments(years)
    for column, formats in (date_formats or {}).items():
        if column in roles and _is_text(batch[column]):
            part["dates"][column] = date_partial(rows[column], formats)
    return part


def _is_text(series: pd.Series) -> bool:
    return pd.api.types.is_string_dtype(series) or series.dtype == object


@dataclass
class TableFit:
    """The partials added up on the driver."""

    roles: dict[str, str]
    numeric: tuple | None = None
    gaps: np.ndarray | None = None
    samples: list | None = None
    counts: dict = field(default_factory=dict)  # column -> value -> rows
    missing: dict = field(default_factory=dict)  # categorical column -> missing rows
    shapes: dict = field(default_factory=dict)  # column -> rows, distinct, length, spaces sums
    years: dict = field(default_factory=dict)
    dates: dict = field(default_factory=dict)  # text column -> format -> year moments

    def add(self, part: dict[str, Any]) -> None:
        self.numeric = (
            part["numeric"]
            if self.numeric is None
            else merge_moments(self.numeric, part["numeric"])
        )
        self.gaps = part["gaps"] if self.gaps is None else self.gaps + part["gaps"]
        if self.samples is None:
            self.samples = part["sample"]
        else:
            self.samples = [
                _keep_smallest(a, b) for a, b in zip(self.samples, part["sample"], strict=True)
            ]
        for column, (counts, missing, shape) in part["categorical"].items():
            merged = self.counts.setdefault(column, {})
            for value, n in counts.items():
                merged[value] = merged.get(value, 0) + int(n)
            if len(merged) > COUNT_CAP:
                top = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:COUNT_CAP]
                self.counts[column] = dict(top)
            self.missing[column] = self.missing.get(column, 0) + missing
            if shape and shape["rows"]:
                total = self.shapes.setdefault(
                    column,
                    {
                        "rows": 0,
                        "distinct": 0,
                        "length": 0.0,
                        "spaces": 0.0,
                        "words": 0.0,
                        "big": 0,
                        "big_distinct": 0,
                    },
                )
                total["rows"] += shape["rows"]
                total["length"] += shape["length"] * shape["rows"]
                total["spaces"] += shape["spaces"] * shape["rows"]
                total["words"] += shape["words"] * shape["rows"]
                if shape["rows"] >= ID_MIN_ROWS:
                    total["big"] += shape["rows"]
                    total["big_distinct"] += shape["distinct"]
        for column, moments in part["datetime"].items():
            before = self.years.get(column)
            self.years[column] = moments if before is None else merge_moments(before, moments)
        for column, fits in part.get("dates", {}).items():
            self._add_dates(column, fits)

    def _add_dates(self, column: str, fits: dict[str, tuple] | None) -> None:
        """Keep the formats every batch's values fit (a batch without values rules none out)."""
        if fits is None:
            return
        if column not in self.dates:
            self.dates[column] = fits
            return
        before = self.dates[column]
        self.dates[column] = {
            f: merge_moments(before[f], m) for f, m in fits.items() if f in before
        }

    def date_format(self, column: str) -> tuple[str, str] | None:
        """(format, how it reads) of a text column whose every train value is a date, or None."""
        return chosen_format(list(self.dates.get(column) or {}))

    def string_role(self, column: str, max_categories: int = 100) -> Found | None:
        """A string column's role by its values (``training.data.string_roles``): "text" (free
        or short), "id-like", or None for a category."""
        counts = self.counts.get(column, {})
        return string_role(self.shapes.get(column), counts, max_categories)

    def median(self, i: int) -> float:
        _, values = self.samples[i]
        return float(np.median(values)) if len(values) else 0.0


def _keep_smallest(a: tuple, b: tuple) -> tuple:
    keys, values = np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])
    if len(keys) > SAMPLE_VALUES:
        keep = np.argpartition(keys, SAMPLE_VALUES)[:SAMPLE_VALUES]
        keys, values = keys[keep], values[keep]
    return keys, values


def vocabulary(counts: dict[str, int], most: int) -> list[str]:
    """The at most ``most`` most frequent values (ties by value, so every run agrees)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [value for value, _ in ranked[:most]]
