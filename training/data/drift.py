"""Drift between two training splits, as plain data: each split's *reference* is fitted with its
spec (per numeric column a percentile sketch and its share of gaps; per categorical column the
shares of its most frequent values), so a later run compares its training data with the
champion's without reading the champion's data again.

A numeric column's population stability index uses fixed bins: the champion's deciles (ties
merged), plus a bin for gaps when either side has any. Each side's share of a bin comes from its
own sketch of ``QUANTILES`` percentiles (of at most ``fitting.SAMPLE_VALUES`` train values), so
a share is exact to about one percentile per bin edge; the same data gives a PSI of exactly 0.
A categorical column's PSI is taken over the champion's listed values, "any other value" and
"missing"; its total variation distance is reported beside it. Empty bins count as ``EPSILON``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Points of a numeric column's percentile sketch (0th, 1st, ..., 100th percentile).
QUANTILES = 101
#: The bins of a numeric column's PSI: the reference's deciles.
BINS = 10
#: The share an empty bin counts as (the PSI of an empty bin is otherwise infinite).
EPSILON = 1e-4
#: The values of a categorical column whose shares the reference keeps (most frequent first).
TOP_CATEGORIES = 200
#: Numeric columns with a reference (a wider table's first ones by position): bounds the spec.
MAX_NUMERIC_COLUMNS = 500
OTHER, MISSING = "<other>", "<missing>"


def numeric_reference(sample: np.ndarray, present_rows: float, gaps: float) -> dict[str, Any]:
    """One numeric column's reference: the percentile sketch of a ``sample`` of its values and
    its share of gaps (of ``present_rows`` + ``gaps`` train rows)."""
    present = np.asarray(sample, dtype=np.float64)
    present = present[np.isfinite(present)]
    rows = float(present_rows) + float(gaps)
    sketch = (
        np.quantile(present, np.linspace(0, 1, QUANTILES), method="inverted_cdf").tolist()
        if len(present)
        else []
    )
    return {"quantiles": [float(v) for v in sketch], "missing": _share(gaps, rows)}


def categorical_reference(counts: dict[str, int], missing: int) -> dict[str, Any]:
    """One categorical column's reference: its most frequent values' shares, the rest's, gaps'."""
    rows = sum(int(n) for n in counts.values()) + int(missing)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
    shares = {str(value): _share(n, rows) for value, n in ranked[:TOP_CATEGORIES]}
    return {"shares": shares, "missing": _share(missing, rows)}


def _share(part: float, whole: float) -> float:
    return float(part) / whole if whole else 0.0


def cdf(sketch: list[float], x: float) -> float:
    """The share of values <= ``x``, read off a percentile sketch (linear between percentiles)."""
    q = np.asarray(sketch, dtype=np.float64)
    if not len(q) or x < q[0]:
        return 0.0
    if x >= q[-1]:
        return 1.0
    step = 1.0 / (len(q) - 1)
    j = int(np.searchsorted(q, x, side="right")) - 1  # the last percentile <= x
    below, above = q[j], q[j + 1]
    return j * step + step * (x - below) / (above - below)


def edges(sketch: list[float]) -> list[float]:
    """The inner bin edges of a reference: its deciles, ties merged."""
    if not sketch:
        return []
    picks = [sketch[round(i * (len(sketch) - 1) / BINS)] for i in range(1, BINS)]
    return sorted(set(picks))


def numeric_shares(reference: dict[str, Any], inner: list[float], gaps: bool) -> list[float]:
    """A numeric reference's shares of the bins (-inf, e1], (e1, e2], ..., (ek, inf) [, gaps]."""
    present = 1.0 - reference["missing"]
    points = [0.0] + [cdf(reference["quantiles"], e) for e in inner] + [1.0]
    shares = [present * (b - a) for a, b in zip(points, points[1:], strict=False)]
    if not reference["quantiles"]:
        shares = [0.0] * len(shares)
    return shares + [reference["missing"]] if gaps else shares


def psi(expected: list[float], actual: list[float], epsilon: float = EPSILON) -> float:
    """Population stability index: sum over bins of (actual - expected) * ln(actual / expected),
    each share at least ``epsilon``."""
    e = np.maximum(np.asarray(expected, dtype=np.float64), epsilon)
    a = np.maximum(np.asarray(actual, dtype=np.float64), epsilon)
    return float(np.sum((a - e) * np.log(a / e)))


@dataclass(frozen=True)
class ColumnDrift:
    """One column's drift from the champion's training data to the new training data."""

    column: str
    kind: str  # numeric | categorical
    psi: float
    tvd: float  # total variation distance of the bins' shares (0 same, 1 disjoint)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def numeric_drift(column: str, champion: dict[str, Any], new: dict[str, Any]) -> ColumnDrift:
    inner = edges(champion["quantiles"])
    gaps = champion["missing"] > 0 or new["missing"] > 0
    expected = numeric_shares(champion, inner, gaps)
    actual = numeric_shares(new, inner, gaps)
    return ColumnDrift(column, "numeric", psi(expected, actual), _tvd(expected, actual))


def categorical_drift(column: str, champion: dict[str, Any], new: dict[str, Any]) -> ColumnDrift:
    values = list(champion["shares"])
    expected = [champion["shares"][v] for v in values]
    # A value the new reference does not list is among its rarest: counted with "other".
    actual = [new["shares"].get(v, 0.0) for v in values]
    for shares, reference in ((expected, champion), (actual, new)):
        shares.append(max(0.0, 1.0 - sum(shares) - reference["missing"]))  # OTHER
        shares.append(reference["missing"])  # MISSING
    return ColumnDrift(column, "categorical", psi(expected, actual), _tvd(expected, actual))


def _tvd(expected: list[float], actual: list[float]) -> float:
    return 0.5 * float(np.abs(np.asarray(expected) - np.asarray(actual)).sum())


def compare(champion: dict[str, Any], new: dict[str, Any]) -> list[ColumnDrift]:
    """Every column both references hold, most drifted first (a column of one kind in one and
    another kind in the other is left out: the champion cannot read it anyway)."""
    found = []
    for kind, measure in (("numeric", numeric_drift), ("categorical", categorical_drift)):
        theirs, ours = champion.get(kind, {}), new.get(kind, {})
        found += [measure(c, theirs[c], ours[c]) for c in theirs if c in ours]
    finite = [d for d in found if math.isfinite(d.psi)]
    return sorted(finite, key=lambda d: (-d.psi, d.column))


@dataclass(frozen=True)
class DriftReport:
    """The new training data against the champion's (version ``champion_version``)."""

    champion_version: str
    columns: list[ColumnDrift]

    def over(self, limit: float) -> list[ColumnDrift]:
        """The columns whose PSI is above ``limit``, most drifted first."""
        return [d for d in self.columns if d.psi > limit]

    def to_dict(self) -> dict[str, Any]:
        return {
            "champion_version": self.champion_version,
            "columns": [d.to_dict() for d in self.columns],
        }

    def table(self) -> dict[str, list]:
        """One row per column, as ``mlflow.log_table`` takes it."""
        rows = [d.to_dict() for d in self.columns]
        keys = ["column", "kind", "psi", "tvd"]
        return {
            "champion_version": [self.champion_version] * len(rows),
            **{k: [r[k] for r in rows] for k in keys},
        }
