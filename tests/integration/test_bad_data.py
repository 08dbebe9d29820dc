"""Bad data the preprocess stage must refuse: missing label, string feature,
NaN labels, a small class, an empty parquet, a truncated or corrupt parquet among good files, a
ragged CSV row. One DataValidationError naming the column or file and the fix, and nothing
written as complete. The stage's own tests: tests/integration/test_preprocess.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.config import DataConfig, PipelineConfig
from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import MANIFEST_FILE, preprocess
from training.errors import DataValidationError
from training.storage import StorageLayout

pytestmark = pytest.mark.integration


def _refused(tmp_path, data: DataConfig, *fragments: str) -> DataValidationError:
    root = tmp_path / "storage"
    config = PipelineConfig(data=data)
    with pytest.raises(DataValidationError) as err:
        files = resolve_inputs(config.data)
        preprocess(config, StorageLayout(root=str(root)), fingerprint(config.data, files), files)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    written = list(root.rglob("*")) if root.exists() else []
    assert not [p for p in written if p.name == MANIFEST_FILE or p.name.startswith("_incoming")]
    return err.value


def test_continuous_label_column_is_not_a_class_label(ray_local, tmp_path):
    # A wrong dtype for a label: floats of a regression target, one "class" per row. With
    # data.task=auto such a label is a regression; asked to classify, it is refused.
    rng = np.random.default_rng(0)
    n = 1200
    table = pa.table(
        {"a": rng.normal(size=n), "b": rng.normal(size=n), "label": rng.normal(size=n)}
    )
    pq.write_table(table, tmp_path / "t.parquet")
    _refused(
        tmp_path,
        DataConfig(source=str(tmp_path / "t.parquet"), task="classification"),
        "label column 'label'",
        "not a class label",
        "data.label_column",
        "data.task=regression",
    )


def test_a_single_class_cannot_train_a_classifier(ray_local, tmp_path):
    rng = np.random.default_rng(1)
    table = pa.table({"a": rng.normal(size=80), "label": np.zeros(80, dtype=np.int64)})
    pq.write_table(table, tmp_path / "t.parquet")
    _refused(tmp_path, DataConfig(source=str(tmp_path / "t.parquet")), "single value", "two")
