"""Data inputs without Ray: resolve_inputs, fingerprint, transform_batch and the bundled data."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.config import BUILTIN_DIGITS, DataConfig, SplitConfig
from training.data.builtin import ensure_digits
from training.data.diagnose import read_error
from training.data.inputs import fingerprint, input_format, resolve_inputs
from training.data.rows import transform_batch
from training.data.schema import Plan
from training.datasets.synthetic import synthetic_images, write_synthetic
from training.errors import DataValidationError
from training.manifest import FeatureSpec


def _write(path, n=4, offset=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": np.arange(n) + offset, "label": np.arange(n) % 2}), path)
    return str(path)


# --- resolve_inputs -------------------------------------------------------------------------


def test_builtin_digits_resolves_to_the_bundled_file(trainflow_home):
    files = resolve_inputs(DataConfig(source=BUILTIN_DIGITS))
    assert files == [str(trainflow_home / "datasets" / "digits" / "digits.parquet")]
    assert os.path.isfile(files[0])


def test_directory_lists_data_files_sorted_recursively(tmp_path):
    b = _write(tmp_path / "b.parquet")
    a = _write(tmp_path / "a.pq")
    nested = _write(tmp_path / "sub" / "c.parquet")
    _write(tmp_path / "_tmp" / "z.parquet")  # hidden by convention
    _write(tmp_path / ".x.parquet")
    (tmp_path / "notes.txt").write_text("not data")
    (tmp_path / "_SUCCESS").write_text("")
    files = resolve_inputs(DataConfig(source=str(tmp_path)))
    assert files == sorted([a, b, nested])
    assert input_format(DataConfig(source=str(tmp_path)), files) == "parquet"


def test_single_file_is_returned_as_is(tmp_path):
    path = _write(tmp_path / "one.parquet")
    assert resolve_inputs(DataConfig(source=path)) == [path]


def test_missing_path_names_it_and_the_fix(tmp_path):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(DataValidationError, match="does not exist") as err:
        resolve_inputs(DataConfig(source=missing))
    assert missing in str(err.value)
    assert BUILTIN_DIGITS in str(err.value)


def test_empty_directory_is_refused(tmp_path):
    (tmp_path / "readme.md").write_text("no data here")
    with pytest.raises(DataValidationError, match="holds no") as err:
        resolve_inputs(DataConfig(source=str(tmp_path)))
    assert str(tmp_path) in str(err.value)


def test_unknown_suffix_suggests_data_format(tmp_path):
    path = tmp_path / "table.dat"
    path.write_text("x,label\n1,0\n")
    with pytest.raises(DataValidationError, match="data.format"):
        resolve_inputs(DataConfig(source=str(path)))
    assert resolve_inputs(DataConfig(source=str(path), format="csv")) == [str(path)]


def test_mixed_formats_need_data_format(tmp_path):
    parquet = _write(tmp_path / "a.parquet")
    (tmp_path / "b.csv").write_text("x,label\n1,0\n")
    with pytest.raises(DataValidationError, match=r"mixes \[.csv., .parquet.\] files"):
        resolve_inputs(DataConfig(source=str(tmp_path)))
    assert resolve_inputs(DataConfig(source=str(tmp_path), format="parquet")) == [parquet]


def test_unknown_builtin_is_refused():
    with pytest.raises(DataValidationError, match="builtin:digits"):
        resolve_inputs(DataConfig(source="builtin:mnist"))


# --- fingerprint ----------------------------------------------------------------------------


def test_fingerprint_is_stable_and_sensitive_to_bytes_and_config(tmp_path):
    files = [_write(tmp_path / "a.parquet"), _write(tmp_path / "b.parquet", offset=10)]
    data = DataConfig(source=str(tmp_path))
    first = fingerprint(data, files)
    assert len(first) == 16 and int(first, 16) >= 0
    assert fingerprint(DataConfig(source=str(tmp_path)), list(files)) == first

    assert fingerprint(data.model_copy(update={"label_column": "x"}), files) != first
    assert fingerprint(data.model_copy(update={"split": SplitConfig(seed=1)}), files) != first
    assert fingerprint(data, files[:1]) != first

    path = tmp_path / "b.parquet"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    assert fingerprint(data, files) != first


def test_a_ray_read_error_is_traced_to_the_file(tmp_path):
    good, bad = tmp_path / "a.csv", tmp_path / "b.csv"
    good.write_text("x,label\n1,0\n")
    bad.write_text("x,label\n1,0\n2,1,7\n")
    plan = Plan("csv", "label", ["x"], None)
    files = [str(good), str(bad)]
    # Ray's words for a CSV it cannot parse: the file, but not the reason.
    ray_error = ValueError(f"Failed to read CSV file: {bad}. Please check the CSV file")
    err = read_error(ray_error, files, plan, None)
    assert isinstance(err, DataValidationError)
    assert str(bad) in str(err) and "Expected 2 columns, got 3" in str(err)
    assert str(good) not in str(err)
    # Not a read error, or a network one: left alone so that a retry can fix it.
    assert read_error(RuntimeError("worker died"), files, plan, None) is None
    assert read_error(OSError(f"AWS Error NETWORK_CONNECTION on {bad}"), files, plan, None) is None


# --- transform_batch ------------------------------------------------------------------------


def _spec(**kwargs) -> FeatureSpec:
    base = {
        "label_column": "y",
        "classes": ["cat", "dog"],
        "input_shape": [2],
        "mean": [1.0, 10.0],
        "std": [2.0, 1.0],
        "feature_columns": ["a", "b"],
    }
    return FeatureSpec(**{**base, **kwargs})


def test_transform_normalises_with_the_spec_statistics():
    batch = pd.DataFrame({"b": [10, 12, 8], "a": [1.0, 5.0, -3.0], "y": ["dog", "cat", "dog"]})
    out = transform_batch(batch, _spec(), with_labels=True)
    assert out["features"].dtype == np.float32
    np.testing.assert_allclose(out["features"], [[0, 0], [2, 2], [-2, -2]])
    assert out["label"].dtype == np.int64
    assert out["label"].tolist() == [1, 0, 1]


def test_transform_maps_numeric_labels_by_sorted_class_index():
    spec = _spec(classes=[3, 7, 11])
    batch = pd.DataFrame({"a": [0.0] * 4, "b": [0.0] * 4, "y": [11, 3, 7.0, 11]})
    assert transform_batch(batch, spec, with_labels=True)["label"].tolist() == [2, 0, 1, 2]


def test_transform_without_labels_needs_no_label_column():
    out = transform_batch(pd.DataFrame({"a": [1.0], "b": [10.0]}), _spec(), with_labels=False)
    assert set(out) == {"features"}
    assert out["features"].shape == (1, 2)


def test_transform_flattens_an_image_column():
    spec = _spec(feature_columns=None, image_column="img", input_shape=[1, 2, 2])
    spec.mean, spec.std = [0.0] * 4, [2.0] * 4
    batch = pd.DataFrame({"img": [np.arange(4.0).reshape(2, 2), np.ones((2, 2))], "y": ["cat"] * 2})
    out = transform_batch(batch, spec, with_labels=True)
    np.testing.assert_allclose(out["features"], [[0, 0.5, 1, 1.5], [0.5] * 4])


def test_transform_of_an_empty_batch_keeps_the_width():
    spec = _spec(feature_columns=None, image_column="img", input_shape=[1, 2, 2])
    spec.mean, spec.std = [0.0] * 4, [1.0] * 4
    empty = pd.DataFrame({"img": pd.Series([], dtype=object), "y": pd.Series([], dtype=object)})
    out = transform_batch(empty, spec, with_labels=True)
    assert out["features"].shape == (0, 4) and out["label"].shape == (0,)


def test_transform_names_a_missing_feature_column():
    with pytest.raises(DataValidationError, match=r"\['b'\]"):
        transform_batch(pd.DataFrame({"a": [1.0], "y": ["cat"]}), _spec(), with_labels=True)


def test_transform_names_a_missing_label_column():
    with pytest.raises(DataValidationError, match="no label column 'y'"):
        transform_batch(pd.DataFrame({"a": [1.0], "b": [2.0]}), _spec(), with_labels=True)


def test_transform_refuses_unknown_labels():
    batch = pd.DataFrame({"a": [1.0, 1.0], "b": [2.0, 2.0], "y": ["cat", "cow"]})
    with pytest.raises(DataValidationError, match="cow"):
        transform_batch(batch, _spec(), with_labels=True)


def test_transform_refuses_a_non_numeric_feature():
    batch = pd.DataFrame({"a": ["x"], "b": [2.0], "y": ["cat"]})
    with pytest.raises(
        DataValidationError, match=r"column 'a' is numeric but holds text \(e.g. 'x'\)"
    ):
        transform_batch(batch, _spec(), with_labels=False)


def test_transform_refuses_the_wrong_width():
    spec = _spec(feature_columns=None, image_column="img", input_shape=[1, 2, 2])
    spec.mean, spec.std = [0.0] * 4, [1.0] * 4
    batch = pd.DataFrame({"img": [np.zeros(9)]})
    with pytest.raises(DataValidationError, match="expects 4"):
        transform_batch(batch, spec, with_labels=False)


# --- bundled and synthetic data -------------------------------------------------------------


def test_ensure_digits_writes_the_real_digits_once(tmp_path):
    path = ensure_digits(tmp_path)
    table = pq.read_table(path)
    assert table.num_rows == 1797
    pixels = [f"pixel_{i:02d}" for i in range(64)]
    assert table.column_names == [*pixels, "label"]
    assert all(table.schema.field(p).type == pa.float32() for p in pixels)
    assert table.schema.field("label").type == pa.int64()
    labels = table.column("label").to_numpy()
    assert sorted(set(labels.tolist())) == list(range(10))
    values = table.select(pixels).to_pandas().to_numpy()
    assert values.min() == 0 and values.max() == 16
    mtime = os.stat(path).st_mtime_ns
    assert ensure_digits(tmp_path) == path
    assert os.stat(path).st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "datasets" / "digits").iterdir()] == ["digits.parquet"]


def test_synthetic_images_are_seeded_and_shaped():
    table = synthetic_images(300, seed=4, side=12)
    assert table.column_names == ["image", "label"]
    assert table.schema.field("image").type == pa.list_(pa.float32(), 144)
    assert table.equals(synthetic_images(300, seed=4, side=12))
    assert not table.equals(synthetic_images(300, seed=5, side=12))
    images = table.column("image").combine_chunks().flatten().to_numpy().reshape(300, 144)
    assert images.min() >= 0.0 and images.max() <= 1.0
    assert len(set(table.column("label").to_pylist())) == 10


def test_synthetic_tabular_variant_has_one_column_per_pixel():
    table = synthetic_images(50, seed=0, side=10, tabular=True)
    assert table.num_columns == 101
    assert table.column_names[0] == "pixel_00" and table.column_names[-1] == "label"
    assert table.schema.field("pixel_99").type == pa.float32()


def test_write_synthetic_splits_rows_over_files(tmp_path):
    files = write_synthetic(tmp_path / "parts", 1001, seed=2, side=8, num_files=3)
    assert [os.path.basename(f) for f in files] == [f"part-{i:05d}.parquet" for i in range(3)]
    tables = [pq.read_table(f) for f in files]
    assert [t.num_rows for t in tables] == [334, 334, 333]
    assert pa.concat_tables(tables).equals(synthetic_images(1001, seed=2, side=8))
    assert sorted(os.listdir(tmp_path / "parts")) == [os.path.basename(f) for f in files]
