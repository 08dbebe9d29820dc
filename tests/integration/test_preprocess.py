"""Preprocessing with Ray Data on the shared local instance: the digits, then bad inputs."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.config import DataConfig, PipelineConfig
from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import MANIFEST_FILE, load_manifest, preprocess
from training.data.read import load_split_arrays, read_split
from training.datasets.synthetic import write_synthetic
from training.errors import DataValidationError
from training.manifest import SPLITS
from training.storage import StorageLayout

pytestmark = pytest.mark.integration


def _run(data: DataConfig, root) -> tuple:
    config = PipelineConfig(data=data)
    layout = StorageLayout(root=str(root))
    files = resolve_inputs(config.data)
    fp = fingerprint(config.data, files)
    return preprocess(config, layout, fp, files), layout, fp, files


@pytest.fixture(scope="module")
def digits(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("storage")
    started = time.monotonic()
    manifest, layout, fp, files = _run(DataConfig(), root)
    return manifest, layout, fp, files, time.monotonic() - started


def test_digits_manifest_counts_every_row(digits):
    manifest = digits[0]
    assert sum(manifest.rows.values()) == 1797
    assert manifest.spec.classes == list(range(10))
    assert manifest.spec.input_shape == [64]
    assert len(manifest.spec.feature_columns) == 64
    for split in SPLITS:
        counts = manifest.class_counts[split]
        assert sum(counts.values()) == manifest.rows[split]
        assert set(counts) == {str(c) for c in range(10)}
        assert manifest.split_uris[split].endswith(f"split={split}")
    assert 0.1 < manifest.rows["val"] / 1797 < 0.2
    assert load_manifest(manifest.data_dir) == manifest


def test_splits_are_disjoint_and_match_the_manifest(digits):
    manifest = digits[0]
    ids = {}
    for split in SPLITS:
        x, y, sid = load_split_arrays(manifest, split)
        assert x.dtype == np.float32 and x.shape == (manifest.rows[split], 64)
        assert y.dtype == np.int64 and sid.dtype == np.int64
        assert np.all(np.diff(sid) >= 0)  # sorted by sample_id
        counts = np.bincount(y, minlength=10)
        assert {str(c): int(n) for c, n in enumerate(counts)} == manifest.class_counts[split]
        ids[split] = set(sid.tolist())
    assert not ids["train"] & ids["val"] and not ids["train"] & ids["test"]
    assert not ids["val"] & ids["test"]
    assert len(ids["train"] | ids["val"] | ids["test"]) == 1797  # the digits have no duplicates


def test_train_features_are_standardised(digits):
    x, _, _ = load_split_arrays(digits[0], "train")
    mean, std = x.mean(axis=0), x.std(axis=0)
    np.testing.assert_allclose(mean, 0, atol=1e-4)
    constant = std < 1e-6  # e.g. the always-blank corner pixels: centred, left unscaled
    assert 0 < constant.sum() < 10
    np.testing.assert_allclose(std[~constant], 1, atol=1e-3)
    x_val, _, _ = load_split_arrays(digits[0], "val")
    assert abs(x_val.mean()) < 0.2  # val is scaled with train's statistics, so only close


def test_second_call_reuses_the_manifest(digits):
    manifest, layout, fp, files, _ = digits
    path = os.path.join(manifest.data_dir, MANIFEST_FILE)
    before = os.stat(path).st_mtime_ns
    started = time.monotonic()
    again = preprocess(PipelineConfig(), layout, fp, files)
    assert time.monotonic() - started < 1.0
    assert again == manifest
    assert os.stat(path).st_mtime_ns == before
    leftovers = [n for n in os.listdir(manifest.data_dir) if n.startswith("_incoming")]
    assert leftovers == []


def test_read_split_feeds_torch_float32_vectors(digits):
    manifest = digits[0]
    ds = read_split(manifest, "val").materialize()  # one read; schema and count come free
    assert ds.schema().names == ["features", "label", "sample_id"]
    batch = next(iter(ds.iter_torch_batches(batch_size=32)))
    assert str(batch["features"].dtype) == "torch.float32"
    assert tuple(batch["features"].shape) == (32, 64)
    assert str(batch["label"].dtype) == "torch.int64"
    assert ds.count() == manifest.rows["val"]


def test_read_split_streams_blocks_of_at_most_the_split_block_size(digits, monkeypatch):
    # Training workers hold copies of the blocks they stream: a block must not be a whole file.
    import ray.data

    from training.data import read

    manifest = digits[0]
    context = ray.data.DataContext.get_current()
    before = context.target_max_block_size
    monkeypatch.setattr(read, "SPLIT_BLOCK_BYTES", 64 * 1024)
    ds = read_split(manifest, "train")
    assert context.target_max_block_size == before  # this process's context as it was
    assert ds.context.target_max_block_size == 64 * 1024
    blocks = ds.materialize().num_blocks()
    assert blocks >= manifest.rows["train"] * manifest.spec.row_bytes // (64 * 1024), blocks
    # A split put in the object store is cut alike, its rows as read_split reads them.
    from training.data.read import split_in_object_store

    stored = split_in_object_store(manifest, "train")
    assert stored.num_blocks() >= blocks // 2, stored.num_blocks()
    assert _sample_ids(stored) == _sample_ids(ds)


def test_a_split_keeps_its_order_as_the_trainer_ingests_it(digits, monkeypatch):
    # Ray Data hands out blocks as their tasks finish unless told to preserve order (its default
    # does not: test_the_trainer_ingests_splits_in_order): over a split of many blocks, a task
    # that finishes last, as load makes one, moved the first block's rows (a fresh clone under
    # load saw them at index 233). Mid-epoch resume skips batches by position, so the trainer
    # ingests with preserve_order, and a split iterated outside it must be too before positions
    # compare: then even a first block made the slowest keeps its place.
    from training.data import read

    manifest = digits[0]
    monkeypatch.setattr(read, "SPLIT_BLOCK_BYTES", 64 * 1024)
    stored = read.split_in_object_store(manifest, "train")
    assert stored.num_blocks() > 2
    in_order = _sample_ids(stored)
    first = in_order[0]

    def first_block_finishes_last(batch):
        if first in batch["sample_id"].to_pylist():
            time.sleep(3)
        return batch

    slowed = stored.map_batches(first_block_finishes_last, batch_format="pyarrow", batch_size=None)
    assert _sample_ids(slowed) == in_order


def test_the_trainer_ingests_splits_in_order():
    import ray.train

    from training.loop.ingest import ingest_options

    assert ingest_options().preserve_order is True
    assert ray.train.DataConfig.default_ingest_options().preserve_order is False  # why we set it


def _sample_ids(ds) -> list[int]:
    """The split's sample ids in the order the trainer ingests it (preserve_order), the only
    order a position in the epoch may rely on."""
    ids = ds.select_columns(["sample_id"])
    ids.context.execution_options.preserve_order = True
    return [row["sample_id"] for row in ids.iter_rows()]


def test_split_does_not_depend_on_file_layout(digits, tmp_path):
    # The same rows shuffled over two files land in the same splits with the same ids.
    manifest = digits[0]
    table = pq.read_table(digits[3][0])
    order = np.random.default_rng(0).permutation(table.num_rows)
    shuffled = table.take(pa.array(order))
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(shuffled.slice(0, 700), src / "a.parquet")
    pq.write_table(shuffled.slice(700), src / "b.parquet")
    other, *_ = _run(DataConfig(source=str(src)), tmp_path / "storage")
    assert other.fingerprint != manifest.fingerprint
    for split in SPLITS:
        x_a, _, ids_a = load_split_arrays(manifest, split)
        x_b, _, ids_b = load_split_arrays(other, split)
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_allclose(x_a, x_b, atol=1e-6)


def test_streamed_read_writes_what_the_in_process_read_writes(digits, tmp_path, monkeypatch):
    """Small inputs are read in the driver (``read_input_here``), large ones stream through Ray
    Data's read tasks (``read_input``): the same rows must come out either way."""
    from training.data import preprocess as stage

    manifest = digits[0]
    monkeypatch.setattr(stage, "CACHE_INPUT_BELOW_BYTES", 0)  # every input streams
    streamed, *_ = _run(DataConfig(), tmp_path / "storage")
    assert streamed.rows == manifest.rows
    assert streamed.class_counts == manifest.class_counts
    assert streamed.spec == manifest.spec
    for split in SPLITS:
        x_a, y_a, ids_a = load_split_arrays(manifest, split)
        x_b, y_b, ids_b = load_split_arrays(streamed, split)
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(y_a, y_b)
        np.testing.assert_array_equal(x_a, x_b)


# --- bad inputs: one clear error, and nothing that looks complete --------------------------


def _good(n: int = 60, seed: int = 0, classes: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.normal(size=n),
        "b": rng.normal(size=n).astype(np.float32),
        "label": np.arange(n) % classes,
    }


def _expect_invalid(tmp_path, data: DataConfig, *fragments: str) -> str:
    root = tmp_path / "storage"
    with pytest.raises(DataValidationError) as err:
        _run(data, root)
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message, message
    written = list(root.rglob("*")) if root.exists() else []
    assert not [p for p in written if p.name == MANIFEST_FILE]
    assert not [p for p in written if p.name.startswith("_incoming")]
    return message


def test_missing_label_column(tmp_path):
    columns = _good()
    columns["target"] = columns.pop("label")
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    message = _expect_invalid(
        tmp_path, DataConfig(source=str(tmp_path / "t.parquet")), "no label column 'label'"
    )
    assert "target" in message and "data.label_column" in message


def test_a_string_feature_column_is_a_category(ray_local, tmp_path):
    columns = _good()
    columns["name"] = np.array([f"n{i % 4}" for i in range(60)], dtype=object)
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    data = DataConfig(source=str(tmp_path / "t.parquet"), feature_columns=["a", "name"])
    manifest = _run(data, tmp_path / "storage")[0]
    assert manifest.spec.column_roles == {"a": "numeric", "name": "categorical"}
    assert sorted(manifest.spec.categories["name"]) == ["n0", "n1", "n2", "n3"]


def test_a_column_declared_numeric_holding_text(tmp_path):
    columns = _good()
    columns["name"] = np.array([f"n{i % 4}" for i in range(60)], dtype=object)
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    data = DataConfig(source=str(tmp_path / "t.parquet"), columns={"name": "numeric"})
    _expect_invalid(tmp_path, data, "'name' is declared numeric", "'n0'")


def test_nan_labels(ray_local, tmp_path):
    columns = _good()
    labels = columns["label"].astype(np.float64)
    labels[[3, 10, 40]] = np.nan
    columns["label"] = labels
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    _expect_invalid(tmp_path, DataConfig(source=str(tmp_path / "t.parquet")), "3 of 60 rows")


def test_class_too_small_for_the_split(ray_local, tmp_path):
    columns = _good()
    columns["label"][[5, 17]] = 9  # class 9: two rows, but 0.15 needs at least 7
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    _expect_invalid(
        tmp_path, DataConfig(source=str(tmp_path / "t.parquet")), "class 9 has 2", "at least 7"
    )


def test_nan_features(ray_local, tmp_path):
    columns = _good()
    columns["b"][[1, 2]] = np.nan
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    data = DataConfig(source=str(tmp_path / "t.parquet"), missing="error")
    _expect_invalid(tmp_path, data, "'b': 2")


def test_infinite_features_are_refused_where_gaps_are_imputed(ray_local, tmp_path):
    columns = _good()
    columns["b"][[1, 2]] = np.inf
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    _expect_invalid(tmp_path, DataConfig(source=str(tmp_path / "t.parquet")), "infinite", "'b': 2")


def test_empty_parquet(tmp_path):
    table = pa.table(_good()).slice(0, 0)
    pq.write_table(table, tmp_path / "t.parquet")
    _expect_invalid(tmp_path, DataConfig(source=str(tmp_path / "t.parquet")), "no rows")


def test_truncated_parquet_among_good_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        pq.write_table(pa.table(_good(seed=i)), src / f"part-{i}.parquet")
    bad = src / "part-1.parquet"
    bad.write_bytes(bad.read_bytes()[:-100])
    _expect_invalid(tmp_path, DataConfig(source=str(src)), str(bad), "re-export it")


def test_parquet_with_a_corrupt_page_among_good_files(ray_local, tmp_path):
    # The footer is intact, so only Ray's read fails: the error must still name the file.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        pq.write_table(pa.table(_good(seed=i)), src / f"part-{i}.parquet")
    bad = src / "part-2.parquet"
    raw = bytearray(bad.read_bytes())
    raw[4:40] = bytes(b ^ 0x5A for b in raw[4:40])  # the first page header
    bad.write_bytes(bytes(raw))
    _expect_invalid(tmp_path, DataConfig(source=str(src)), str(bad), "re-export it")


def test_csv_with_a_ragged_row(ray_local, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = [f"{i * 0.5},{i % 3},{i % 2}" for i in range(40)]
    (src / "a.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    rows.insert(20, "1.0,2,0,99")  # one field too many
    (src / "b.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    message = _expect_invalid(
        tmp_path, DataConfig(source=str(src)), str(src / "b.csv"), "re-export it"
    )
    assert "a.csv" not in message


def test_good_csv_directory_preprocesses(ray_local, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for part in range(2):
        rows = [f"{(i + part) * 0.25},{i % 5},{'cat' if i % 2 else 'dog'}" for i in range(60)]
        (src / f"{part}.csv").write_text("a,b,kind\n" + "\n".join(rows) + "\n")
    manifest, *_ = _run(DataConfig(source=str(src), label_column="kind"), tmp_path / "storage")
    assert sum(manifest.rows.values()) == 120
    assert manifest.spec.classes == ["cat", "dog"]
    assert manifest.spec.feature_columns == ["a", "b"]
    _, y, _ = load_split_arrays(manifest, "train")
    assert set(y.tolist()) == {0, 1}


def test_image_column_preprocesses(ray_local, tmp_path):
    src = tmp_path / "images.parquet"
    write_synthetic(src, 400, seed=1, side=8)
    data = DataConfig(source=str(src), image_column="image", image_shape=[1, 8, 8])
    manifest, *_ = _run(data, tmp_path / "storage")
    assert manifest.spec.input_shape == [1, 8, 8] and manifest.spec.image_column == "image"
    assert sum(manifest.rows.values()) == 400
    x, _, _ = load_split_arrays(manifest, "train")
    assert x.shape == (manifest.rows["train"], 64)
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-4)


def test_image_shape_must_match_the_image_column(tmp_path):
    src = tmp_path / "images.parquet"
    write_synthetic(src, 50, seed=1, side=8)
    data = DataConfig(source=str(src), image_column="image", image_shape=[1, 7, 7])
    _expect_invalid(tmp_path, data, "data.image_shape [1, 7, 7] holds 49", "has 64")
