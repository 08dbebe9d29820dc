"""At small size: the sweep's seeded sample of the train split, and bad input in one file
of a multi-file table (corrupt row group, another schema, null labels) named before training, with
nothing written to the storage root."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.config import DataConfig, PipelineConfig, SweepConfig
from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import preprocess
from training.data.read import load_split_arrays
from training.datasets.synthetic import synthetic_table, write_table
from training.errors import DataValidationError
from training.storage import StorageLayout
from training.tune.sweep import sample_sizes

pytestmark = pytest.mark.integration

FILES = 6


def _preprocess(source, root):
    config = PipelineConfig(data=DataConfig(source=str(source)))
    files = resolve_inputs(config.data)
    return preprocess(config, StorageLayout(root=str(root)), fingerprint(config.data, files), files)


@pytest.fixture(scope="module")
def table_manifest(ray_local, tmp_path_factory):
    src = tmp_path_factory.mktemp("table")
    write_table(src / "t", 3000, seed=5, num_files=FILES)
    return _preprocess(src / "t", tmp_path_factory.mktemp("storage"))


def test_sweep_sample_is_a_seeded_subset_of_the_train_split(table_manifest):
    full_x, full_y, full_ids = load_split_arrays(table_manifest, "train")
    x, y, ids = load_split_arrays(table_manifest, "train", sample_rows=500, seed=0)
    assert len(ids) == 500 and x.shape == (500, 64) and x.dtype == np.float32
    where = np.searchsorted(full_ids, ids)
    assert np.array_equal(full_ids[where], ids)  # every sampled row is a train row, unchanged
    assert np.array_equal(full_x[where], x) and np.array_equal(full_y[where], y)
    again = load_split_arrays(table_manifest, "train", sample_rows=500, seed=0)[2]
    assert np.array_equal(again, ids)  # reproducible
    other = load_split_arrays(table_manifest, "train", sample_rows=500, seed=1)[2]
    assert len(np.intersect1d(other, ids)) < 250  # another seed, another sample
    # A sample as large as the split is the split.
    assert len(load_split_arrays(table_manifest, "train", sample_rows=10**6)[2]) == len(full_ids)


def test_sample_sizes_scale_val_with_train(table_manifest):
    rows = table_manifest.rows
    sizes = sample_sizes(SweepConfig(sample_rows=rows["train"] // 4), table_manifest)
    assert sizes["train"] == rows["train"] // 4
    assert abs(sizes["val"] - rows["val"] / 4) <= 1
    assert sample_sizes(SweepConfig(sample_rows=None), table_manifest) == {
        "train": rows["train"],
        "val": rows["val"],
    }
    # TorchTrainer trials stream the whole splits.
    assert (
        sample_sizes(SweepConfig(sample_rows=10, workers_per_trial=2), table_manifest)["train"]
        == rows["train"]
    )


# --- one bad file among good ones ---------------------------------------------------------------


def _parts(tmp_path, row_group_size: int = 100) -> list:
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(5):
        path = src / f"part-{i}.parquet"
        pq.write_table(synthetic_table(400, seed=i), path, row_group_size=row_group_size)
        paths.append(path)
    return paths


def _expect_invalid(tmp_path, *fragments: str) -> str:
    root = tmp_path / "storage"
    with pytest.raises(DataValidationError) as err:
        _preprocess(tmp_path / "src", root)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, message
    written = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    assert not written, written  # nothing half-written in the storage root
    return message


def test_corrupt_row_group_in_the_middle_is_named(ray_local, tmp_path):
    paths = _parts(tmp_path)
    bad = paths[2]
    meta = pq.read_metadata(bad)
    group = meta.row_group(2).column(10)  # a data page of the third row group
    start = group.data_page_offset
    raw = bytearray(bad.read_bytes())
    raw[start : start + 40] = bytes(b ^ 0x5A for b in raw[start : start + 40])
    bad.write_bytes(bytes(raw))
    message = _expect_invalid(tmp_path, str(bad), "row group 2 of 4", "re-export it")
    assert "part-1" not in message and "part-3" not in message


def test_a_file_with_another_label_type_is_named(tmp_path):
    paths = _parts(tmp_path)
    table = synthetic_table(400, seed=9)
    labels = pa.array([str(v) for v in table.column("label").to_pylist()])
    pq.write_table(table.set_column(64, "label", labels), paths[3])
    _expect_invalid(tmp_path, str(paths[3]), "label column has type string", "int64")


def test_a_file_missing_a_feature_column_is_named(tmp_path):
    paths = _parts(tmp_path)
    pq.write_table(synthetic_table(400, seed=9).drop_columns(["f17"]), paths[1])
    _expect_invalid(tmp_path, str(paths[1]), "'f17'")


def test_a_file_with_a_text_feature_is_named(tmp_path):
    paths = _parts(tmp_path)
    table = synthetic_table(400, seed=9)
    text = pa.array([f"{v:.3f}" for v in table.column("f05").to_pylist()])
    pq.write_table(table.set_column(5, "f05", text), paths[4])
    _expect_invalid(tmp_path, str(paths[4]), "'f05'", "string")


def test_null_labels_in_one_file_name_the_file_and_row(ray_local, tmp_path):
    paths = _parts(tmp_path)
    table = synthetic_table(400, seed=9)
    labels = table.column("label").to_pylist()
    labels[250] = labels[390] = None
    pq.write_table(
        table.set_column(64, "label", pa.array(labels, pa.int64())), paths[3], row_group_size=100
    )
    _expect_invalid(
        tmp_path, "2 of 2000 rows", str(paths[3]), "row group 2 of 4", "row 250 of the file"
    )


def test_other_numeric_widths_in_one_file_still_preprocess(ray_local, tmp_path):
    # float64 (or int) features in one file and float32 in the rest are the same features.
    paths = _parts(tmp_path)
    table = synthetic_table(400, seed=9)
    pq.write_table(
        table.cast(
            pa.schema(
                [
                    pa.field(n, pa.float64() if n != "label" else pa.int32())
                    for n in table.column_names
                ]
            )
        ),
        paths[2],
    )
    manifest = _preprocess(tmp_path / "src", tmp_path / "storage")
    assert sum(manifest.rows.values()) == 2000


def test_generated_color_images_preprocess_as_3x32x32(ray_local, tmp_path):
    from training.datasets.synthetic import write_color_images

    write_color_images(tmp_path / "img", 300, seed=0, num_files=3)
    config = PipelineConfig(
        data=DataConfig(
            source=str(tmp_path / "img"), image_column="image", image_shape=[3, 32, 32]
        ),
        model={"kind": "cnn"},
    )
    files = resolve_inputs(config.data)
    manifest = preprocess(
        config, StorageLayout(root=str(tmp_path / "s")), fingerprint(config.data, files), files
    )
    assert sum(manifest.rows.values()) == 300
    assert manifest.spec.input_shape == [3, 32, 32]
    x, _, _ = load_split_arrays(manifest, "train")
    assert x.shape[1] == 3 * 32 * 32 and x.dtype == np.float32
