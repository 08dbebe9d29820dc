"""``data.missing_label``: a table with rows that have no label, preprocessed on the shared Ray
instance: refused by default (naming the setting), or trained without them under ``drop``."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training import progress
from training.config import DataConfig, PipelineConfig
from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import preprocess
from training.data.read import load_split_arrays
from training.data.splits import raw_split, raw_split_here
from training.errors import DataValidationError
from training.manifest import SPLITS
from training.storage import StorageLayout

pytestmark = pytest.mark.integration
ROWS, UNLABELLED = 600, 37


def _table(path) -> str:
    """600 rows of two classes; rows 5, 21, 37, ... (37 of them) without a label."""
    rng = np.random.default_rng(0)
    labels = np.array(["a", "b"], dtype=object)[rng.integers(0, 2, ROWS)]
    labels[5 : 5 + 16 * UNLABELLED : 16] = None
    table = pa.table({"x": rng.normal(size=ROWS), "y": rng.normal(size=ROWS), "label": labels})
    pq.write_table(table, path)
    return str(path)


def _preprocess(tmp_path, missing_label: str):
    source = _table(tmp_path / "t.parquet")
    config = PipelineConfig(data=DataConfig(source=source, missing_label=missing_label))
    files = resolve_inputs(config.data)
    layout = StorageLayout(root=str(tmp_path / "storage"))
    return source, preprocess(config, layout, fingerprint(config.data, files), files)


def test_unlabelled_rows_are_refused_by_default(ray_local, tmp_path):
    with pytest.raises(DataValidationError) as err:
        _preprocess(tmp_path, "error")
    assert f"{UNLABELLED} of {ROWS} rows have no value" in str(err.value)
    assert "data.missing_label: drop" in str(err.value)


def test_drop_trains_on_the_labelled_rows_alone(ray_local, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=progress.LOGGER):
        source, manifest = _preprocess(tmp_path, "drop")
    assert sum(manifest.rows.values()) == ROWS - UNLABELLED
    assert manifest.rows_dropped_unlabeled == UNLABELLED
    assert (
        manifest.first_unlabeled.startswith(source)
        and "row 5 of the file" in manifest.first_unlabeled
    )
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert said and f"{UNLABELLED} of {ROWS} rows have no value" in said[0]
    for split in SPLITS:
        features, labels, _ = load_split_arrays(manifest, split)
        assert len(labels) == manifest.rows[split]
        # Evaluation and the gate score a split's raw rows: only labelled ones are found.
        here = pd.concat(list(raw_split_here(manifest, split)))
        assert len(here) == manifest.rows[split] and here["label"].notna().all()
    assert raw_split(manifest, "test").count() == manifest.rows["test"]
