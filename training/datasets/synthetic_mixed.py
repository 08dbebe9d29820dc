"""The ``mixed`` table of ``trainflow make-data --kind mixed``: a table as users hold them, at any
size, the same for the same seed however it is written (chunks of ``CHUNK_ROWS``, one random
stream per (seed, chunk)).

Columns: ``amount``, ``tenure``, ``score`` (float64, about 5 % empty), ``plan`` (5 text
categories, some empty), ``region`` (500 text categories, skewed), ``signup`` (timestamps),
``customer_id`` (a distinct code per row: id-like) and ``label`` (4 classes) that depends mostly
on ``plan`` and ``region``, a little on ``amount`` and the signup month.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from training.datasets.synthetic import CHUNK_ROWS, write_chunks

PLANS = ("basic", "plus", "pro", "team", "enterprise")
REGIONS = 500
CLASSES = 4
GAPS = 0.05
_MIXED, _EFFECTS = 4, 5


def _effects(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each plan's and each region's pull towards each class: the label's dependence."""
    rng = np.random.default_rng([seed, _EFFECTS])
    return rng.normal(0, 2.0, (len(PLANS), CLASSES)), rng.normal(0, 1.5, (REGIONS, CLASSES))


def mixed_chunk(n_rows: int, seed: int, index: int) -> pa.Table:
    """Chunk ``index`` of the mixed table (rows ``index * CHUNK_ROWS`` on)."""
    rng = np.random.default_rng([seed, _MIXED, index])
    plan_effect, region_effect = _effects(seed)
    plan = rng.integers(0, len(PLANS), n_rows)
    region = np.minimum(rng.zipf(1.3, n_rows) - 1, REGIONS - 1)
    amount = rng.lognormal(3.0, 1.0, n_rows)
    tenure = rng.gamma(2.0, 12.0, n_rows)
    score = rng.normal(0.0, 1.0, n_rows)
    start = np.datetime64("2020-01-01T00:00:00", "s")
    signup = start + rng.integers(0, 4 * 365 * 86400, n_rows).astype("timedelta64[s]")
    month = pd.DatetimeIndex(signup).month.to_numpy()
    logits = plan_effect[plan] + region_effect[region] + rng.gumbel(0, 1.0, (n_rows, CLASSES))
    logits[:, 0] += 0.5 * np.log(amount) - 1.5
    logits[:, 1] += 0.8 * np.cos(2 * np.pi * month / 12)
    first = index * CHUNK_ROWS
    plans = np.asarray(PLANS, dtype=object)[plan]
    plans[rng.random(n_rows) < GAPS / 2] = None
    columns = {
        "amount": _with_gaps(rng, amount),
        "tenure": _with_gaps(rng, tenure),
        "score": _with_gaps(rng, score),
        "plan": pa.array(plans, pa.string()),
        "region": pa.array([f"R{r:03d}" for r in region.tolist()], pa.string()),
        "signup": pa.array(signup, pa.timestamp("s")),
        "customer_id": pa.array([f"C{first + i:010d}" for i in range(n_rows)], pa.string()),
        "label": pa.array(logits.argmax(axis=1).astype(np.int64)),
    }
    return pa.table(columns)


def _with_gaps(rng: np.random.Generator, values: np.ndarray) -> pa.Array:
    return pa.array(values, mask=rng.random(len(values)) < GAPS)


def write_mixed(
    path: str | Path,
    n_rows: int,
    seed: int,
    *,
    num_files: int = 16,
    endpoint_url: str | None = None,
) -> list[str]:
    """Write the mixed table to ``num_files`` parquet files, streaming."""

    def maker(rows: int, index: int) -> pa.Table:
        return mixed_chunk(rows, seed, index)

    return write_chunks(path, n_rows, maker, num_files=num_files, endpoint_url=endpoint_url)
