"""Reading with Ray Data (the input, raw rows to predict on, a written split) and reading a
written split into numpy arrays without Ray."""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.fs as pafs

from training.data.schema import Plan, csv_options
from training.errors import StorageError
from training.manifest import FEATURES, LABEL, SAMPLE_ID, Manifest
from training.storage import filesystem, is_remote

if TYPE_CHECKING:
    import ray.data

_FOOTER_ACTORS = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
_env_lock = threading.Lock()


def _read_parquet(paths: list[str], fs, columns: list[str] | None) -> ray.data.Dataset:
    """``ray.data.read_parquet`` of chosen files, with as few footer-reading actors as needed."""
    import ray.data

    # Ray 2.60 starts 32 footer-reading actors (processes) per parquet read unless told
    # otherwise: seconds of start-up and GBs of memory on a small machine. The reader takes
    # the count from the environment when the dataset is created, so set it just for this.
    with _env_lock:
        preset = os.environ.get(_FOOTER_ACTORS)
        if preset is None:
            os.environ[_FOOTER_ACTORS] = str(min(32, math.ceil(len(paths) / 10)))
        try:
            # file_extensions=None: the files are chosen already (Ray's default drops *.pq);
            # partitioning=None: a `k=v` directory in a path must not become a column.
            ds = ray.data.read_parquet(
                paths, filesystem=fs, file_extensions=None, partitioning=None
            )
        finally:
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
    return _read(files, plan.fmt, endpoint_url, plan.columns, csv_options(plan))


def read_raw(files: list[str], fmt: str, endpoint_url: str | None = None) -> ray.data.Dataset:
    """New raw rows (every column) as a Ray Dataset, read like the training input."""
    return _read(files, fmt, endpoint_url, None, {})


def _read(
    files: list[str], fmt: str, endpoint_url: str | None, columns: list[str] | None, csv: dict
) -> ray.data.Dataset:
    import ray.data

    fs, paths = None, files
    if is_remote(files[0]):
        fs = filesystem(files[0], endpoint_url)[0]
        paths = [filesystem(f, endpoint_url)[1] for f in files]
    if fmt == "parquet":
        return _read_parquet(paths, fs, columns)
    return ray.data.read_csv(paths, filesystem=fs, file_extensions=None, partitioning=None, **csv)


def read_split(manifest: Manifest, split: str, endpoint_url: str | None = None) -> ray.data.Dataset:
    """One split as a Ray Dataset with columns features/label/sample_id."""
    uri = manifest.split_uris[split]
    fs, path = filesystem(uri, endpoint_url)
    listing = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted(i.path for i in listing if i.type == pafs.FileType.File)
    return _read_parquet(files, fs if is_remote(uri) else None, [FEATURES, LABEL, SAMPLE_ID])


def load_split_arrays(
    manifest: Manifest, split: str, endpoint_url: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features float32 [n, d], labels [n], sample_ids int64 [n]) sorted by sample_id; labels
    int64 class indices, or a regression's normalised float32 values.

    Plain pyarrow, no Ray: Tune trials call this.
    """
    import pyarrow.parquet as pq

    uri = manifest.split_uris[split]
    fs, path = filesystem(uri, endpoint_url)
    table = pq.read_table(
        path, filesystem=fs, columns=[FEATURES, LABEL, SAMPLE_ID], partitioning=None
    )
    width = manifest.spec.num_features
    vectors = table.column(FEATURES).combine_chunks()
    features = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
    label_dtype = np.float32 if manifest.spec.is_regression else np.int64
    labels = table.column(LABEL).to_numpy().astype(label_dtype)
    ids = table.column(SAMPLE_ID).to_numpy().astype(np.int64)
    if len(ids) != manifest.rows[split]:
        raise StorageError(
            f"{uri} holds {len(ids)} rows but its manifest says {manifest.rows[split]}; the data "
            f"directory was changed: delete {manifest.data_dir} to preprocess again"
        )
    order = np.argsort(ids, kind="stable")
    return features[order].astype(np.float32, copy=False), labels[order], ids[order]
