"""Evaluation finds a split's raw rows again, as preprocessing assigned them, in Arrow batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from training.config import SplitConfig
from training.data import splits
from training.data.rows import output_rows
from training.manifest import SAMPLE_ID, FeatureSpec

COLUMNS = ["a", "b", "c"]
SPEC = FeatureSpec("label", [0, 1, 2], [3], [0.0] * 3, [1.0] * 3, feature_columns=COLUMNS)
SPLIT = SplitConfig()


def _raw(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(rows, 3)).astype(np.float32), columns=COLUMNS)
    frame["label"] = rng.integers(0, 3, rows)
    return frame


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_arrow_batches_find_the_rows_preprocessing_wrote_to_the_split(split):
    raw = _raw(3000)
    written = output_rows(raw, SPEC, SPLIT).to_pandas()
    expected = written.loc[written["split"] == split, SAMPLE_ID].tolist()
    kwargs = {"spec": SPEC.to_dict(), "split_config": SPLIT.model_dump(), "split": split}

    found = splits._arrow_rows_of_split(pa.Table.from_pandas(raw), **kwargs)

    assert isinstance(found, pa.Table)  # stays Arrow: Ray Data's fast path
    assert found.column_names == [*COLUMNS, "label"]  # the user's own columns, as read
    assert 0 < found.num_rows < len(raw)
    # The same rows, in the same order, as the pandas path and as preprocessing's split.
    pandas_found = splits._rows_of_split(raw, **kwargs)
    assert found.to_pandas().equals(pandas_found)
    again = output_rows(found.to_pandas(), SPEC, SPLIT).to_pandas()
    assert again[SAMPLE_ID].tolist() == expected
    assert set(again["split"]) == {split}


@pytest.mark.parametrize(
    ("features", "most", "budget", "expected"),
    [
        (64, 65_536, 64 * 1024**2, 65_536),  # a table: capped by rows
        (3 * 32 * 32, 65_536, 64 * 1024**2, 2730),  # images: capped by bytes
        (64, 4096, 16 * 1024**2, 4096),
        (3 * 224 * 224, 4096, 16 * 1024**2, 64),  # never fewer than 64
    ],
)
def test_batches_of_raw_rows_are_bounded_in_rows_and_bytes(features, most, budget, expected):
    spec = FeatureSpec("label", [0, 1], [features], [0.0], [1.0], feature_columns=["x"])
    assert splits.batch_rows(spec, most, budget) == expected
