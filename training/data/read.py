"""Reading with Ray Data (the input, raw rows to predict on, a written split) and reading a
written split into numpy arrays without Ray."""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.fs as pafs

from training.data.formats import IMAGES, iter_batches, ray_read, read_table
from training.data.image_files import (
    ray_read_images,
    read_image_bytes,
    read_images_here,
    with_decoded_paths,
)
from training.data.rows import sample_keys
from training.data.schema import Plan, read_types
from training.data.token_lists import is_token_lists, padded_lists
from training.errors import StorageError
from training.manifest import FEATURES, LABEL, SAMPLE_ID, Manifest
from training.storage import filesystem, is_remote

if TYPE_CHECKING:
    import ray.data

_FOOTER_ACTORS = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
_env_lock = threading.Lock()
# Image files decoded per batch of a table of image paths.
_IMAGE_PATH_BATCH_ROWS = 256
# Rows per batch when a split is read without Ray (a trial's sample).
_READ_BATCH_ROWS = 65_536
# Largest block of a written split streamed to the training workers. Each worker's Ray Data
# iterator holds copies of the blocks it is going through in its own memory (not the object
# store's), and Ray's default (128 MiB) made a block of a whole written file: at 6M rows of the
# mixed table each of two workers held 152 MiB of Arrow buffers for one epoch, at 16 MiB 31 MiB
# (the same epoch as fast; /tmp experiment of 2026-11-27, 4.2M-row train split, 7 files).
SPLIT_BLOCK_BYTES = 16 * 1024**2


def _read_parquet(
    paths: list[str], fs, columns: list[str] | None, block_bytes: int | None = None
) -> ray.data.Dataset:
    """``ray.data.read_parquet`` of chosen files, with as few footer-reading actors as needed,
    in blocks of at most ``block_bytes`` (None: Ray Data's own target)."""
    import ray.data

    # Ray 2.60 starts 32 footer-reading actors (processes) per parquet read unless told
    # otherwise: seconds of start-up and GBs of memory on a small machine. The reader takes
    # the count from the environment when the dataset is created, so set it just for this.
    # The block size, likewise, is read from the current DataContext when the dataset is
    # created (its read batches, and the copy of the context its execution keeps).
    context = ray.data.DataContext.get_current()
    with _env_lock:
        preset = os.environ.get(_FOOTER_ACTORS)
        block_preset = context.target_max_block_size
        if preset is None:
            os.environ[_FOOTER_ACTORS] = str(min(32, math.ceil(len(paths) / 10)))
        if block_bytes is not None:
            context.target_max_block_size = block_bytes
        try:
            # file_extensions=None: the files are chosen already (Ray's default drops *.pq);
            # partitioning=None: a `k=v` directory in a path must not become a column.
            ds = ray.data.read_parquet(
                paths, filesystem=fs, file_extensions=None, partitioning=None
            )
        finally:
            context.target_max_block_size = block_preset
            if preset is None:
                os.environ.pop(_FOOTER_ACTORS, None)
    # read_parquet(columns=) is deprecated in 2.60
    return ds.select_columns(columns) if columns else ds


def input_bytes(files: list[str], endpoint_url: str | None) -> int:
    """Bytes of the input files as stored (one listing call per file system)."""
    fs, _ = filesystem(files[0], endpoint_url)
    infos = fs.get_file_info([filesystem(f, endpoint_url)[1] for f in files])
    return sum(info.size or 0 for info in infos)


def read_input(files: list[str], plan: Plan, endpoint_url: str | None) -> ray.data.Dataset:
    """The input files as a Ray Dataset of the plan's columns (lazy: nothing is read yet)."""
    if plan.fmt == IMAGES:
        paths, fs = _located(files, endpoint_url)
        return ray_read_images(paths, fs, plan)
    dataset = _read(files, plan.fmt, endpoint_url, plan.columns, read_types(plan), plan.sheet)
    if plan.image_root is None:
        return dataset
    return dataset.map_batches(
        with_decoded_paths,
        fn_kwargs={"plan": plan, "endpoint_url": endpoint_url},
        batch_format="pyarrow",
        batch_size=_IMAGE_PATH_BATCH_ROWS,
    )


def read_input_here(files: list[str], plan: Plan, endpoint_url: str | None) -> ray.data.Dataset:
    """A small input read here with pyarrow, one block per file as Ray Data's read makes
    them (files may differ in numeric widths), put in the object store with
    ``ray.data.from_arrow``: the same rows and columns as ``read_input`` materialized, without
    Ray Data's listing, footer and read tasks (about 6 s of worker start-up on digits)."""
    import ray.data

    if plan.fmt == IMAGES:  # decoded by Ray's image reader once, for both passes
        return read_input(files, plan, endpoint_url).materialize()
    tables = []
    for file in files:
        fs, path = filesystem(file, endpoint_url)
        table = read_table(fs, path, plan.fmt, plan.columns, read_types(plan), plan.sheet)
        if plan.image_root is not None:
            table = with_decoded_paths(table, plan, endpoint_url)
        tables.append(table)
    return ray.data.from_arrow(tables)


def input_batches(files: list[str], plan: Plan, endpoint_url: str | None):
    """The input's plan columns as pandas batches, file by file, read here with pyarrow
    (no Ray): for the few raw rows of a split, or a small split scored in this process."""
    if plan.fmt == IMAGES:
        for table in read_images_here(files, plan, endpoint_url):
            yield table.to_pandas()
        return
    for file in files:
        fs, path = filesystem(file, endpoint_url)
        types = read_types(plan)
        for batch in iter_batches(fs, path, plan.fmt, plan.columns, types, plan.sheet):
            if plan.image_root is not None:
                batch = with_decoded_paths(batch, plan, endpoint_url)
            yield batch.to_pandas()


def read_raw(
    files: list[str], fmt: str, endpoint_url: str | None = None, sheet: str | int | None = None
) -> ray.data.Dataset:
    """New raw rows (every column) as a Ray Dataset, read like the training input (a
    workbook's sheet ``sheet``); image files as {image: the file's bytes, path} (the model
    decodes them as training did)."""
    if fmt == IMAGES:
        return read_image_bytes(*_located(files, endpoint_url))
    return _read(files, fmt, endpoint_url, None, None, sheet)


def _read(
    files: list[str],
    fmt: str,
    endpoint_url: str | None,
    columns: list[str] | None,
    types: dict | None,
    sheet: str | int | None = None,
) -> ray.data.Dataset:
    paths, fs = _located(files, endpoint_url)
    if fmt == "parquet":
        return _read_parquet(paths, fs, columns)
    return ray_read(paths, fs, fmt, columns, types, sheet)


def _located(files: list[str], endpoint_url: str | None) -> tuple[list[str], object]:
    """(the paths Ray Data reads, their file system: None for local files)."""
    if not is_remote(files[0]):
        return files, None
    fs = filesystem(files[0], endpoint_url)[0]
    return [filesystem(f, endpoint_url)[1] for f in files], fs


def _split_files(manifest: Manifest, split: str, endpoint_url: str | None):
    """(file system, the split's parquet files in a fixed order)."""
    fs, path = filesystem(manifest.split_uris[split], endpoint_url)
    listing = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return fs, sorted(i.path for i in listing if i.type == pafs.FileType.File)


def read_split(manifest: Manifest, split: str, endpoint_url: str | None = None) -> ray.data.Dataset:
    """One split as a Ray Dataset with columns features/label/sample_id (lazy, streamed)."""
    fs, files = _split_files(manifest, split, endpoint_url)
    remote = is_remote(manifest.split_uris[split])
    columns = [FEATURES, LABEL, SAMPLE_ID]
    return _read_parquet(files, fs if remote else None, columns, SPLIT_BLOCK_BYTES)


def split_in_object_store(
    manifest: Manifest, split: str, endpoint_url: str | None = None
) -> ray.data.Dataset:
    """One small split read here with pyarrow and put in the object store as it is
    (``ray.data.from_arrow``): the same rows, in the same order, as ``read_split``
    materialized, without a Ray Data read (a file-listing task and a read task, ~2 s per
    split on a small machine, mostly worker start-up). In blocks of at most
    ``SPLIT_BLOCK_BYTES``, as ``read_split`` streams them: one block of a 4.2M-row split
    (250 MB) left each of two training workers holding a copy of its half."""
    import pyarrow.parquet as pq
    import ray.data

    fs, files = _split_files(manifest, split, endpoint_url)
    dataset = pq.ParquetDataset(files, filesystem=fs, partitioning=None)
    table = dataset.read(columns=[FEATURES, LABEL, SAMPLE_ID])
    _check_rows(table.num_rows, manifest.rows[split], manifest.split_uris[split], manifest)
    stored = ray.data.from_arrow(_blocks(table, SPLIT_BLOCK_BYTES))
    del table
    _release_arrow_memory()
    return stored


def _release_arrow_memory() -> None:
    """Arrow's pool gives back what this thread freed. The driver keeps Arrow's own pool
    (mimalloc), which holds freed memory per thread: a split read and put in the object store
    (90 MB) left 250 MB resident in the reading thread's heap, 105 MB once released."""
    import pyarrow

    pyarrow.default_memory_pool().release_unused()


def _blocks(table, most_bytes: int) -> list:
    """``table`` as consecutive slices of at most ``most_bytes`` (at least one row each)."""
    rows = max(1, most_bytes * max(1, table.num_rows) // max(1, table.nbytes))
    return [table.slice(start, rows) for start in range(0, max(1, table.num_rows), rows)]


def load_split_arrays(
    manifest: Manifest,
    split: str,
    endpoint_url: str | None = None,
    *,
    sample_rows: int | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features float32 [n, d], labels [n], sample_ids int64 [n]) sorted by sample_id; labels
    int64 class indices, or a regression's normalised float32 values.

    Plain pyarrow, no Ray: Tune trials call this. With ``sample_rows`` smaller than the split,
    only a seeded sample of that many rows (the smallest ``sample_keys``) is kept, read batch by
    batch: memory holds the sample and one batch, never the whole split.
    """
    import pyarrow.dataset as pads

    uri = manifest.split_uris[split]
    fs, path = filesystem(uri, endpoint_url)
    dataset = pads.dataset(path, filesystem=fs, format="parquet", partitioning=None)
    expected = manifest.rows[split]
    keep = None
    if sample_rows is not None and sample_rows < expected:
        ids = dataset.to_table(columns=[SAMPLE_ID]).column(SAMPLE_ID).to_numpy()
        _check_rows(len(ids), expected, uri, manifest)
        keys = sample_keys(ids.astype(np.int64), seed)
        keep = np.partition(keys, sample_rows - 1)[sample_rows - 1]
    width = manifest.spec.num_features
    label_dtype = np.float32 if manifest.spec.is_regression else np.int64
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    # Little read-ahead: pyarrow's default (16 batches x 4 files) holds ~0.5 GB of a wide split.
    batches = dataset.to_batches(
        columns=[FEATURES, LABEL, SAMPLE_ID],
        batch_size=_READ_BATCH_ROWS,
        batch_readahead=2,
        fragment_readahead=1,
    )
    for batch in batches:
        ids = batch.column(SAMPLE_ID).to_numpy().astype(np.int64)
        features, labels = _matrix(batch.column(FEATURES), width), batch.column(LABEL).to_numpy()
        if keep is not None:
            mask = sample_keys(ids, seed) <= keep
            features, labels, ids = features[mask], labels[mask], ids[mask]
        parts.append((features.astype(np.float32, copy=True), labels.astype(label_dtype), ids))
    features = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, width), np.float32)
    labels = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, label_dtype)
    ids = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    if keep is None:
        _check_rows(len(ids), expected, uri, manifest)
    order = np.argsort(ids, kind="stable")[:sample_rows]  # ties at the cut: the first ids
    arrays = features[order], labels[order], ids[order]
    del parts, batches
    _release_arrow_memory()  # the batches read (a sample's: the whole split's ids too)
    return arrays


def _matrix(column, width: int) -> np.ndarray:
    """A batch's features as [rows, width]: a text model's token ids padded to ``width``."""
    if is_token_lists(column):
        return padded_lists(column, width)
    return column.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)


def _check_rows(found: int, expected: int, uri: str, manifest: Manifest) -> None:
    if found != expected:
        raise StorageError(
            f"{uri} holds {found} rows but its manifest says {expected}; the data "
            f"directory was changed: delete {manifest.data_dir} to preprocess again"
        )
