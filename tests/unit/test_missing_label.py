"""``data.missing_label``: a row without a label refused (the default, naming the fix) or
dropped before the split, counted and said; checked without Ray (preflight, the batch filter,
the preprocess line and run tags)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pydantic import ValidationError

from training.config import DataConfig, PipelineConfig
from training.data.rows import labelled_rows
from training.errors import DataValidationError
from training.manifest import FeatureSpec, Manifest
from training.stages.preflight import check_data_now
from training.stages.preprocess import _dropped_tags, _dropped_text


def _csv(tmp_path) -> str:
    path = tmp_path / "t.csv"
    path.write_text("x,label\n1,a\n2,\n3,b\n4,\n")
    return str(path)


def test_missing_label_is_error_or_drop_and_error_by_default():
    assert DataConfig().missing_label == "error"
    assert DataConfig(missing_label="drop").missing_label == "drop"
    with pytest.raises(ValidationError, match="missing_label"):
        DataConfig(missing_label="skip")


def test_the_error_counts_the_rows_names_the_first_and_the_drop_setting(tmp_path):
    path = _csv(tmp_path)
    with pytest.raises(DataValidationError) as err:
        check_data_now(PipelineConfig(data=DataConfig(source=path)))
    message = str(err.value)
    assert "2 of 4 rows have no value in label column 'label'" in message
    assert f"{path} (row 1 of the file)" in message
    assert "data.missing_label: drop" in message


def test_drop_lets_the_unlabelled_rows_past_the_early_check(tmp_path):
    path = _csv(tmp_path)
    check_data_now(PipelineConfig(data=DataConfig(source=path, missing_label="drop")))


def test_labelled_rows_keeps_only_rows_with_a_label():
    table = pa.table({"x": [1, 2, 3, 4], "y": [0.5, None, float("nan"), 2.0]})
    assert labelled_rows(table, "y").column("x").to_pylist() == [1, 4]
    text = pa.table({"x": [1, 2], "y": [None, "a"]})
    assert labelled_rows(text, "y").column("x").to_pylist() == [2]


def _manifest(dropped: int, first: str) -> Manifest:
    spec = FeatureSpec(
        label_column="label", classes=["a", "b"], input_shape=[1], mean=[0.0], std=[1.0]
    )
    return Manifest(
        "f",
        "s",
        "d",
        {},
        {"train": 2},
        {},
        spec,
        rows_dropped_unlabeled=dropped,
        first_unlabeled=first,
    )


def test_the_drop_is_said_on_the_preprocess_line_and_tagged_on_the_run():
    manifest = _manifest(2, "/d/t.csv (row 1 of the file)")
    assert (
        _dropped_text(manifest)
        == " (2 without a label dropped, the first in /d/t.csv (row 1 of the file))"
    )
    assert _dropped_tags(manifest) == {
        "data.rows_dropped_unlabeled": "2",
        "data.first_unlabeled_row": "/d/t.csv (row 1 of the file)",
    }
    assert _dropped_text(_manifest(0, "")) == ""
    assert Manifest.from_json(manifest.to_json()).rows_dropped_unlabeled == 2
