"""Ray Data preprocessing: read, validate, split, fit train statistics, transform, write parquet.

The output directory ``<storage>/data/<fingerprint>/`` holds ``split=train|val|test/*.parquet``
with columns ``features`` (fixed-size float32 list), ``label`` (int64 class index) and
``sample_id`` (int64 row hash), and ``manifest.json``, written last as the completion marker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import pickle
import shutil
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs

from training.config import BUILTIN_DIGITS, DataConfig, PipelineConfig, SplitConfig
from training.datasets import ensure_digits
from training.errors import DataValidationError, ServiceUnreachableError, StorageError
from training.manifest import FEATURES, LABEL, SAMPLE_ID, SPLITS, FeatureSpec, Manifest
from training.storage import (
    StorageLayout,
    delete_dir,
    exists,
    filesystem,
    is_remote,
    join,
    read_text,
    trainflow_home,
    upload_file,
    write_text_atomic,
)

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger(__name__)

# Bump when the output of preprocessing changes for the same input and config: old caches die.
PREPROCESS_VERSION = "1"
MANIFEST_FILE = "manifest.json"
SPLIT = "split"
MAX_CLASSES = 1000
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
# Rows per map_batches call: bounds worker memory for wide images.
_BATCH_ROWS = 4096
# Inputs smaller than this (bytes on disk) are read once into the object store and both passes
# (summary, then transform + write) run over it. Each Ray Data execution of a parquet read
# starts and kills its own footer-reading actor and re-reads the files; larger inputs stream.
CACHE_INPUT_BELOW_BYTES = 64 * 1024**2
_FIX_FILE = "re-export it or remove it from the input directory"
_FOOTER_ACTORS = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
_env_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Inputs


def _uri(source: str, path: str) -> str:
    return f"s3://{path}" if source.startswith("s3://") else path


def _hidden(relative: str) -> bool:
    # Spark/Hive markers (_SUCCESS, _temporary) and dot files are not data.
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def resolve_inputs(
    data: DataConfig, endpoint_url: str | None = None, storage_root: str | None = None
) -> list[str]:
    """The input files of ``data.source``: the bundled digits, one file, or a directory's files.

    With a remote ``storage_root`` the bundled digits are copied there first: on a cluster, read
    tasks run on nodes that do not share the driver's disk.
    """
    source = data.source
    if source == BUILTIN_DIGITS:
        local = ensure_digits(trainflow_home())
        if storage_root and is_remote(storage_root):
            target = join(storage_root, "datasets", "digits", os.path.basename(local))
            return [upload_file(local, target, endpoint_url)]
        return [local]
    if source.startswith("builtin:"):
        raise DataValidationError(
            f"unknown built-in data set {source!r}; use {BUILTIN_DIGITS} or a parquet/CSV path"
        )
    fs, path = filesystem(source, endpoint_url)
    try:
        info = fs.get_file_info(path)
    except OSError as exc:
        # Remote: maybe a network blip, so retriable; local: a permission problem, so not.
        kind = ServiceUnreachableError if is_remote(source) else StorageError
        raise kind(f"cannot reach {source}: {exc}; check data.source and credentials") from None
    if info.type == pafs.FileType.NotFound:
        raise DataValidationError(
            f"data.source {source!r} does not exist; give an existing file or directory "
            f"(absolute path or s3://bucket/key) or {BUILTIN_DIGITS}"
        )
    if info.type == pafs.FileType.File:
        files = [_uri(source, path)]
        input_format(data, files)  # fail now on an unknown suffix
        return files
    wanted = {s for s, f in _SUFFIXES.items() if data.format in ("auto", f)}
    found = []
    for entry in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        relative = entry.path[len(path) :].lstrip("/")
        suffix = os.path.splitext(entry.path)[1].lower()
        if entry.type == pafs.FileType.File and suffix in wanted and not _hidden(relative):
            found.append(_uri(source, entry.path))
    if not found:
        kinds = "/".join(sorted(wanted))
        raise DataValidationError(
            f"directory {source!r} holds no {kinds} files; put the data files there or point "
            "data.source at a file"
        )
    files = sorted(found)
    input_format(data, files)
    return files


def input_format(data: DataConfig, files: list[str]) -> str:
    """``parquet`` or ``csv``: ``data.format``, else every file's suffix (which must agree)."""
    if data.format != "auto":
        return data.format
    formats = set()
    for file in files:
        suffix = os.path.splitext(file)[1].lower()
        if suffix not in _SUFFIXES:
            raise DataValidationError(
                f"cannot tell the format of {file!r} from its suffix {suffix!r}; "
                "set data.format to parquet or csv"
            )
        formats.add(_SUFFIXES[suffix])
    if len(formats) > 1:
        raise DataValidationError(
            f"{data.source!r} mixes parquet and CSV files; keep one format there, or set "
            "data.format to read only one of them"
        )
    return formats.pop()


def fingerprint(data: DataConfig, files: list[str], endpoint_url: str | None = None) -> str:
    """16 hex chars of sha256 over every input file's bytes, the data config and the version."""
    digest = hashlib.sha256(f"trainflow-preprocess:{PREPROCESS_VERSION}\n".encode())
    digest.update(json.dumps(data.model_dump(mode="json"), sort_keys=True).encode())
    for file in files:
        fs, path = filesystem(file, endpoint_url)
        per_file = hashlib.sha256()
        try:
            with fs.open_input_stream(path) as stream:
                while chunk := stream.read(1 << 20):
                    per_file.update(chunk)
        except (FileNotFoundError, PermissionError) as exc:
            raise DataValidationError(f"cannot read input file {file}: {exc}; check it") from None
        # A digest per file keeps file boundaries: moving bytes between files changes the result.
        digest.update(per_file.digest())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Row-level pieces shared by preprocessing and prediction


def _split_key(seed: int) -> str:
    # hash_pandas_object needs a 16-character key.
    return hashlib.sha256(f"trainflow-split:{seed}".encode()).hexdigest()[:16]


def _keyed_mix(hashes: np.ndarray, key: str) -> np.ndarray:
    """splitmix64 of (hash XOR key)."""
    # pandas ignores hash_key for numeric columns: without this every seed gives the same split.
    z = hashes ^ np.uint64(int(key, 16))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _matrix_from_column(series: pd.Series, column: str) -> np.ndarray:
    n = len(series)
    if isinstance(series.dtype, pd.ArrowDtype):
        arr = pa.array(series.array)
        arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        if arr.null_count:
            raise DataValidationError(
                f"column {column!r} has {arr.null_count} empty rows; drop or fill them"
            )
        if pa.types.is_fixed_size_list(arr.type):
            flat = arr.flatten().to_numpy(zero_copy_only=False)
            return flat.astype(np.float64).reshape(n, arr.type.list_size)
        if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
            import pyarrow.compute as pc

            lengths = set(pc.list_value_length(arr).to_pylist())
            if len(lengths) > 1:
                raise DataValidationError(
                    f"column {column!r} has rows of different lengths {sorted(lengths)[:5]}; "
                    "every row needs the same number of values"
                )
            width = lengths.pop() if lengths else 0
            flat = arr.flatten().to_numpy(zero_copy_only=False)
            return flat.astype(np.float64).reshape(n, width)
    values = series.to_numpy()
    if values.dtype != object and values.ndim >= 2:  # a tensor extension column
        return values.reshape(n, -1).astype(np.float64)
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        raise DataValidationError(f"column {column!r} has empty rows; drop or fill them")
    rows = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        raise DataValidationError(
            f"column {column!r} has rows of different lengths {sorted(lengths)[:5]}; every row "
            "needs the same number of values"
        )
    return np.stack(rows) if rows else np.zeros((0, 0))


def _feature_matrix(
    batch: pd.DataFrame, feature_columns: list[str] | None, image_column: str | None
) -> np.ndarray:
    """Raw rows -> float64 [n, width], before normalisation."""
    wanted = [image_column] if image_column else list(feature_columns or [])
    missing = [c for c in wanted if c not in batch.columns]
    if missing:
        raise DataValidationError(
            f"the rows lack column(s) {missing} that the features are made of; available: "
            f"{list(batch.columns)[:20]}. Add them, or check data.feature_columns/image_column"
        )
    if image_column:
        return _matrix_from_column(batch[image_column], image_column)
    try:
        return batch[wanted].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):
        bad = [c for c in wanted if not pd.api.types.is_numeric_dtype(batch[c])]
        raise DataValidationError(
            f"feature column(s) {bad} are not numeric (dtypes {[str(batch[c].dtype) for c in bad]})"
            "; convert them to numbers or leave them out of data.feature_columns"
        ) from None


def _hashable_labels(labels: pd.Series) -> np.ndarray:
    # int 3 and float 3.0 must hash alike: a batch with a null turns an int column into floats.
    if pd.api.types.is_numeric_dtype(labels):
        return labels.to_numpy(dtype=np.float64, na_value=np.nan)
    return labels.astype(object).to_numpy()


def _missing(labels: pd.Series) -> np.ndarray:
    # Ray Data hands pandas UDFs ArrowDtype columns, where NaN is a value, not NA: check both.
    mask = np.array(labels.isna(), dtype=bool)  # a copy: arrow-backed arrays are read-only
    if pd.api.types.is_numeric_dtype(labels):
        mask |= np.isnan(labels.to_numpy(dtype=np.float64, na_value=np.nan))
    return mask


def row_hashes(
    batch: pd.DataFrame,
    *,
    label_column: str,
    feature_columns: list[str] | None = None,
    image_column: str | None = None,
    seed: int = 0,
) -> np.ndarray:
    """A seeded 64-bit hash (uint64) of each row's features and label: its identity and split."""
    raw = _feature_matrix(batch, feature_columns, image_column)
    return _hash_rows(raw, batch[label_column], seed)


def _hash_rows(raw: np.ndarray, labels: pd.Series, seed: int) -> np.ndarray:
    frame = pd.DataFrame(raw)
    frame[raw.shape[1]] = _hashable_labels(labels)
    key = _split_key(seed)
    hashed = pd.util.hash_pandas_object(frame, index=False, hash_key=key)
    return _keyed_mix(hashed.to_numpy(dtype=np.uint64), key)


def assign_splits(hashes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """train/val/test per row from its hash: u = hash / 2**64 against the split fractions."""
    u = hashes.astype(np.float64) / 2.0**64
    return np.where(u < split.test, "test", np.where(u < split.test + split.val, "val", "train"))


def _labels_of(batch: pd.DataFrame, column: str) -> pd.Series:
    if column not in batch.columns:
        raise DataValidationError(
            f"the rows have no label column {column!r}; available: {list(batch.columns)[:20]}. "
            "Add it, or set data.label_column"
        )
    return batch[column]


def transform_batch(
    batch: pd.DataFrame, spec: FeatureSpec, with_labels: bool
) -> dict[str, np.ndarray]:
    """Raw rows -> {"features": float32 [n, num_features], "label": int64 [n]} (label optional)."""
    raw = _feature_matrix(batch, spec.feature_columns, spec.image_column)
    if len(raw) == 0:  # an empty block: an image column cannot tell its width
        raw = raw.reshape(0, spec.num_features)
    if raw.shape[1] != spec.num_features:
        raise DataValidationError(
            f"the rows give {raw.shape[1]} feature values but the model expects "
            f"{spec.num_features} (input_shape {spec.input_shape}); use data shaped like the "
            "training data"
        )
    mean = np.asarray(spec.mean, dtype=np.float64)
    std = np.asarray(spec.std, dtype=np.float64)
    out = {"features": ((raw - mean) / std).astype(np.float32)}
    if with_labels:
        labels = _labels_of(batch, spec.label_column)
        codes = pd.Index(spec.classes).get_indexer(labels)
        if (codes < 0).any():
            unknown = sorted({str(v) for v in labels[codes < 0]})
            raise DataValidationError(
                f"label column {spec.label_column!r} holds {int((codes < 0).sum())} rows with "
                f"values the model does not know ({unknown[:5]}); known classes: "
                f"{spec.classes[:20]}. Drop those rows or retrain with them"
            )
        out["label"] = codes.astype(np.int64)
    return out


# ---------------------------------------------------------------------------------------------
# Schema check on the driver (footers and CSV headers only; no heavy pass)


@dataclass(frozen=True)
class _Plan:
    fmt: str
    label: str
    features: list[str] | None
    image: str | None

    @property
    def columns(self) -> list[str]:
        return [*(self.features or [self.image]), self.label]


def _is_numeric(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_decimal(dtype)
    )


def _csv_options(plan: _Plan) -> dict[str, Any]:
    import pyarrow.csv as pacsv

    # Fixed feature types: blocks (and files) whose inference differs (int vs float) still concat.
    # strings_can_be_null: an empty label cell is a missing label, not a class named "".
    options = pacsv.ConvertOptions(
        column_types={c: pa.float64() for c in plan.features or []},
        include_columns=plan.columns,
        strings_can_be_null=True,
    )
    return {"convert_options": options}


def _file_schema(file: str, fmt: str, endpoint_url: str | None) -> tuple[pa.Schema, int | None]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    fs, path = filesystem(file, endpoint_url)
    try:
        if fmt == "parquet":
            meta = pq.read_metadata(path, filesystem=fs)
            return meta.schema.to_arrow_schema(), meta.num_rows
        with fs.open_input_stream(path) as stream:
            return pacsv.open_csv(stream).schema, None
    except (pa.ArrowInvalid, OSError) as exc:
        if _is_network(exc):
            raise ServiceUnreachableError(
                f"cannot read {file}: {exc}; check the network and storage.endpoint_url"
            ) from None
        raise DataValidationError(
            f"input file {file} is not a readable {fmt} file ({exc}); {_FIX_FILE}"
        ) from None


def _is_network(exc: BaseException) -> bool:
    # pyarrow reports S3 trouble as OSError, like a corrupt file: a retry may fix only these.
    text = str(exc)
    return isinstance(exc, (ConnectionError, TimeoutError)) or any(
        hint in text for hint in ("AWS Error", "curl", "Connection refused", "timed out")
    )


def _check_schema(data: DataConfig, files: list[str], fmt: str, endpoint_url: str | None) -> _Plan:
    features = list(data.feature_columns) if data.feature_columns else None
    width = None
    total_rows: int | None = 0
    for file in files:
        schema, rows = _file_schema(file, fmt, endpoint_url)
        total_rows = None if rows is None or total_rows is None else total_rows + rows
        names = schema.names
        if data.label_column not in names:
            raise DataValidationError(
                f"{file} has no label column {data.label_column!r}; its columns are "
                f"{names[:20]}. Set data.label_column to the column to predict"
            )
        if data.image_column is not None:
            width = _check_image_column(file, schema, data.image_column)
            continue
        if features is None:
            features = [
                n for n in names if n != data.label_column and _is_numeric(schema.field(n).type)
            ]
            skipped = [n for n in names if n != data.label_column and n not in features]
            if skipped:
                log.warning("skipping non-numeric columns %s of %s", skipped[:20], file)
            if not features:
                raise DataValidationError(
                    f"{file} has no numeric column besides the label {data.label_column!r}; set "
                    "data.feature_columns or data.image_column"
                )
        missing = [c for c in features if c not in names]
        if missing:
            which = "data.feature_columns" if data.feature_columns else "the first file's columns"
            raise DataValidationError(
                f"{file} lacks feature column(s) {missing} (from {which}); its columns are "
                f"{names[:20]}. Fix data.feature_columns or {_FIX_FILE}"
            )
        for column in features:
            dtype = schema.field(column).type
            if not _is_numeric(dtype):
                raise DataValidationError(
                    f"feature column {column!r} in {file} has type {dtype}, not a number; convert "
                    "it to numbers or leave it out of data.feature_columns"
                )
        width = len(features)
    if total_rows == 0:
        raise DataValidationError(
            f"the input has no rows (all {len(files)} file(s) are empty: {files[:3]}); point "
            "data.source at data with rows"
        )
    if data.image_shape is not None and width is not None and math.prod(data.image_shape) != width:
        raise DataValidationError(
            f"data.image_shape {data.image_shape} holds {math.prod(data.image_shape)} values but "
            f"each row has {width}; fix data.image_shape"
        )
    return _Plan(fmt, data.label_column, features, data.image_column)


def _check_image_column(file: str, schema: pa.Schema, column: str) -> int | None:
    if column not in schema.names:
        raise DataValidationError(
            f"{file} has no image column {column!r}; its columns are {schema.names[:20]}. "
            "Set data.image_column"
        )
    dtype = schema.field(column).type
    shape = getattr(dtype, "shape", None)  # Ray's tensor extension types
    if shape is not None and all(isinstance(d, int) and d > 0 for d in shape):
        return math.prod(shape)
    storage = dtype.storage_type if isinstance(dtype, pa.ExtensionType) else dtype
    is_list = pa.types.is_list(storage) or pa.types.is_large_list(storage)
    if (is_list or pa.types.is_fixed_size_list(storage)) and _is_numeric(storage.value_type):
        return storage.list_size if pa.types.is_fixed_size_list(storage) else None
    raise DataValidationError(
        f"image column {column!r} in {file} has type {dtype}; data.image_column needs a column of "
        "fixed-size numeric arrays (e.g. list<float>)"
    )


# ---------------------------------------------------------------------------------------------
# Ray Data passes


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


def _input_bytes(files: list[str], endpoint_url: str | None) -> int:
    """Bytes of the input files as stored (one listing call per file system)."""
    fs, _ = filesystem(files[0], endpoint_url)
    infos = fs.get_file_info([filesystem(f, endpoint_url)[1] for f in files])
    return sum(info.size or 0 for info in infos)


def _read(files: list[str], plan: _Plan, endpoint_url: str | None) -> ray.data.Dataset:
    import ray.data

    fs = None
    paths = files
    if is_remote(files[0]):
        fs = filesystem(files[0], endpoint_url)[0]
        paths = [filesystem(f, endpoint_url)[1] for f in files]
    if plan.fmt == "parquet":
        return _read_parquet(paths, fs, plan.columns)
    return ray.data.read_csv(
        paths, filesystem=fs, file_extensions=None, partitioning=None, **_csv_options(plan)
    )


def _summarise(batch: pd.DataFrame, plan: _Plan, split: SplitConfig) -> dict[str, np.ndarray]:
    """A tiny per-batch summary: split/class counts, null labels, non-finite values, train stats."""
    try:
        summary = _summary(batch, plan, split) if len(batch) else {"rows": 0}
    except DataValidationError as exc:
        # Carried as data: Ray would wrap a raised exception and lose its type.
        summary = {"error": str(exc)}
    return {"summary": np.array([pickle.dumps(summary)], dtype=object)}


def _summary(batch: pd.DataFrame, plan: _Plan, split: SplitConfig) -> dict[str, Any]:
    raw = _feature_matrix(batch, plan.features, plan.image)
    labels = batch[plan.label]
    splits = assign_splits(_hash_rows(raw, labels, split.seed), split)
    null = _missing(labels)
    frame = pd.DataFrame({"split": splits[~null], "label": labels[~null].to_numpy()})
    counts: dict[str, dict[Any, int]] = {s: {} for s in SPLITS}
    for (s, value), n in frame.groupby(["split", "label"], sort=False).size().items():
        counts[s][value.item() if hasattr(value, "item") else value] = int(n)
    bad = (~np.isfinite(raw)).sum(axis=0)
    names = plan.features or [plan.image] * raw.shape[1]
    nonfinite: dict[str, int] = {}
    for name, n in zip(names, bad.tolist(), strict=True):
        if n:
            nonfinite[name] = nonfinite.get(name, 0) + n
    train = raw[splits == "train"]
    mean = train.mean(axis=0) if len(train) else np.zeros(raw.shape[1])
    m2 = ((train - mean) ** 2).sum(axis=0)
    return {
        "rows": len(batch),
        "width": raw.shape[1],
        "class_counts": counts,
        "null_labels": int(null.sum()),
        "nonfinite": nonfinite,
        "train": (len(train), mean, m2),
    }


def _merge_moments(a: tuple, b: tuple) -> tuple:
    # Chan et al.'s parallel variance: exact for constant columns, unlike sum/sum-of-squares.
    (na, ma, m2a), (nb, mb, m2b) = a, b
    if na == 0:
        return b
    if nb == 0:
        return a
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta**2 * (na * nb / n)


@dataclass
class _Stats:
    rows: int = 0
    widths: set | None = None
    class_counts: dict | None = None
    null_labels: int = 0
    nonfinite: dict | None = None
    train: tuple = (0, 0.0, 0.0)

    def add(self, part: dict[str, Any]) -> None:
        if "error" in part:
            raise DataValidationError(part["error"])
        if part["rows"] == 0:
            return
        self.rows += part["rows"]
        self.widths = (self.widths or set()) | {part["width"]}
        self.class_counts = self.class_counts or {s: {} for s in SPLITS}
        for s, per_class in part["class_counts"].items():
            for value, n in per_class.items():
                self.class_counts[s][value] = self.class_counts[s].get(value, 0) + n
        self.null_labels += part["null_labels"]
        self.nonfinite = self.nonfinite or {}
        for name, n in part["nonfinite"].items():
            self.nonfinite[name] = self.nonfinite.get(name, 0) + n
        self.train = _merge_moments(self.train, part["train"])


def _sorted_classes(values: set) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:  # mixed types: order by type name, then value text
        return sorted(values, key=lambda v: (type(v).__name__, str(v)))


def _validate(stats: _Stats, data: DataConfig, plan: _Plan, files: list[str]) -> list[Any]:
    """Raise on unusable data; return the sorted classes."""
    label = data.label_column
    if stats.rows == 0:
        raise DataValidationError(
            f"the input has no rows ({len(files)} file(s): {files[:3]}); point data.source at "
            "data with rows"
        )
    if stats.null_labels:
        raise DataValidationError(
            f"{stats.null_labels} of {stats.rows} rows have no value in label column {label!r}; "
            "drop or fill those rows before training"
        )
    if stats.nonfinite:
        detail = ", ".join(f"{k!r}: {v}" for k, v in list(stats.nonfinite.items())[:10])
        raise DataValidationError(
            f"feature values are NaN or infinite ({detail}); drop or impute those rows, or leave "
            "the columns out of data.feature_columns"
        )
    if len(stats.widths) > 1:
        raise DataValidationError(
            f"column {plan.image!r} has rows of different lengths {sorted(stats.widths)[:5]}; "
            "every row needs the same number of values"
        )
    width = next(iter(stats.widths))
    if data.image_shape is not None and math.prod(data.image_shape) != width:
        raise DataValidationError(
            f"data.image_shape {data.image_shape} holds {math.prod(data.image_shape)} values but "
            f"each row of {plan.image!r} has {width}; fix data.image_shape"
        )
    totals: dict[Any, int] = {}
    for per_class in stats.class_counts.values():
        for value, n in per_class.items():
            totals[value] = totals.get(value, 0) + n
    if len(totals) > MAX_CLASSES:
        raise DataValidationError(
            f"label column {label!r} has {len(totals)} distinct values (more than {MAX_CLASSES}); "
            "it is probably not a class label: set data.label_column to the class column"
        )
    if len(totals) < 2:
        raise DataValidationError(
            f"label column {label!r} has a single value {list(totals)}; a classifier needs at "
            "least two classes"
        )
    smallest = min(data.split.val, data.split.test)
    need = math.ceil(1 / smallest - 1e-9)
    small = {v: n for v, n in totals.items() if n < need}
    if small:
        detail = ", ".join(f"class {v!r} has {n}" for v, n in list(small.items())[:10])
        raise DataValidationError(
            f"too few rows per class for the split ({detail}); with data.split.val="
            f"{data.split.val} and test={data.split.test} each class needs at least {need} rows. "
            "Add rows, drop those classes, or raise data.split.val/test"
        )
    for s in SPLITS:
        if not stats.class_counts[s]:
            raise DataValidationError(
                f"the {s} split got no rows out of {stats.rows}; add rows or raise data.split.val"
                "/test"
            )
    return _sorted_classes(set(totals))


def _write_rows(batch: pd.DataFrame, spec: FeatureSpec, split: SplitConfig) -> pa.Table:
    hashes = row_hashes(
        batch,
        label_column=spec.label_column,
        feature_columns=spec.feature_columns,
        image_column=spec.image_column,
        seed=split.seed,
    )
    out = transform_batch(batch, spec, with_labels=True)
    features = out["features"]
    # A plain fixed-size list (not Ray's tensor type) so pyarrow alone can read the files back.
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), spec.num_features)
    return pa.table(
        {
            FEATURES: vectors,
            LABEL: out["label"],
            SAMPLE_ID: hashes.view(np.int64),
            SPLIT: assign_splits(hashes, split),
        }
    )


def _read_error(exc: Exception, files: list[str], plan: _Plan, endpoint_url: str | None):
    """Turn a Ray read failure into a DataValidationError naming the file, if it is the data's."""
    if _is_network(exc):
        return None
    text = str(exc)
    named = sorted((f for f in files if f in text or f.removeprefix("s3://") in text), key=len)
    if named:
        candidates = named[-1:]
    elif isinstance(exc, (OSError, ValueError, pa.ArrowException)):
        candidates = files  # Ray's parquet errors do not always name the file: look for it
    else:
        return None  # not a read error (a lost worker, ...): let it be retried
    for file in candidates:
        reason = _diagnose(file, plan, endpoint_url)
        if reason is not None:
            return DataValidationError(f"cannot read {file} as {plan.fmt}: {reason}; {_FIX_FILE}")
    if named:
        return DataValidationError(f"cannot read {named[-1]} as {plan.fmt}; {_FIX_FILE}")
    return None


def _diagnose(file: str, plan: _Plan, endpoint_url: str | None) -> str | None:
    """Read one file fully with pyarrow on the driver; the error text, or None if it reads."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    fs, path = filesystem(file, endpoint_url)
    try:
        if plan.fmt == "parquet":
            for _ in pq.ParquetFile(path, filesystem=fs).iter_batches(columns=plan.columns):
                pass
        else:
            with fs.open_input_stream(path) as stream:
                for _ in pacsv.open_csv(stream, **_csv_options(plan)):
                    pass
    except (pa.ArrowException, OSError, ValueError) as exc:
        return None if _is_network(exc) else str(exc).strip().splitlines()[0]
    return None


# ---------------------------------------------------------------------------------------------
# The stage


def load_manifest(data_dir: str, endpoint_url: str | None = None) -> Manifest | None:
    """The manifest of a completed preprocessing output, or None if it is not complete."""
    uri = join(data_dir, MANIFEST_FILE)
    if not exists(uri, endpoint_url):
        return None
    try:
        return Manifest.from_json(read_text(uri, endpoint_url))
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageError(
            f"{uri} is not a valid manifest ({exc}); delete {data_dir} to preprocess again"
        ) from None


def preprocess(
    config: PipelineConfig, layout: StorageLayout, fingerprint: str, files: list[str]
) -> Manifest:
    """Validate, split, normalise and write the data once per fingerprint (Ray must be running)."""
    data_dir = layout.data_dir(fingerprint)
    done = load_manifest(data_dir, layout.endpoint_url)
    if done is not None:
        log.info("reusing preprocessed data %s (manifest exists)", data_dir)
        return done
    data = config.data
    in_endpoint = config.storage.endpoint_url
    if not files:
        raise DataValidationError(f"no input files for {data.source!r}; check data.source")
    plan = _check_schema(data, files, input_format(data, files), in_endpoint)
    ds = _read(files, plan, in_endpoint)
    if _input_bytes(files, in_endpoint) < CACHE_INPUT_BELOW_BYTES:
        with _naming_bad_files(files, plan, in_endpoint):
            ds = ds.materialize()

    stats = _Stats()
    summaries = ds.map_batches(
        _summarise,
        batch_format="pandas",
        batch_size=_BATCH_ROWS,
        fn_kwargs={"plan": plan, "split": data.split},
    )
    with _naming_bad_files(files, plan, in_endpoint):
        for row in summaries.iter_rows():
            stats.add(pickle.loads(row["summary"]))
    classes = _validate(stats, data, plan, files)

    n_train, mean, m2 = stats.train
    std = np.sqrt(m2 / n_train)
    std = np.where(std > 0, std, 1.0)  # constant columns: leave them centred, not divided by 0
    width = next(iter(stats.widths))
    spec = FeatureSpec(
        label_column=data.label_column,
        classes=classes,
        input_shape=list(data.image_shape) if data.image_shape else [width],
        mean=[float(v) for v in np.broadcast_to(mean, (width,))],
        std=[float(v) for v in np.broadcast_to(std, (width,))],
        feature_columns=plan.features,
        image_column=plan.image,
    )
    rows_out = ds.map_batches(
        _write_rows,
        batch_format="pandas",
        batch_size=_BATCH_ROWS,
        fn_kwargs={"spec": spec, "split": data.split},
        udf_modifying_row_count=False,
    )
    with _naming_bad_files(files, plan, in_endpoint):
        _write(rows_out, data_dir, layout.endpoint_url)

    class_counts = {
        s: {str(v): stats.class_counts[s][v] for v in classes if v in stats.class_counts[s]}
        for s in SPLITS
    }
    manifest = Manifest(
        fingerprint=fingerprint,
        source=data.source,
        data_dir=data_dir,
        split_uris={s: join(data_dir, f"{SPLIT}={s}") for s in SPLITS},
        rows={s: sum(class_counts[s].values()) for s in SPLITS},
        class_counts=class_counts,
        spec=spec,
        preprocessing=data.model_dump(mode="json"),
        input_files=list(files),
    )
    # Last: the manifest is the completion marker.
    write_text_atomic(join(data_dir, MANIFEST_FILE), manifest.to_json(), layout.endpoint_url)
    log.info("preprocessed %d rows into %s", stats.rows, data_dir)
    return manifest


@contextlib.contextmanager
def _naming_bad_files(files: list[str], plan: _Plan, endpoint_url: str | None):
    """Re-raise a Ray read failure as a DataValidationError naming the file, where it is one."""
    try:
        yield
    except DataValidationError:
        raise
    except Exception as exc:
        clean = _read_error(exc, files, plan, endpoint_url)
        if clean is None:
            raise
        raise clean from None


def _write(rows: ray.data.Dataset, data_dir: str, endpoint_url: str | None) -> None:
    # Split directories without a manifest are leftovers of a failed attempt.
    for s in SPLITS:
        delete_dir(join(data_dir, f"{SPLIT}={s}"), endpoint_url)
    if is_remote(data_dir):
        # No rename on S3: write in place; the manifest still comes last.
        fs, path = filesystem(data_dir, endpoint_url)
        rows.write_parquet(path, partition_cols=[SPLIT], filesystem=fs)
        return
    staging = join(data_dir, f"_incoming-{uuid.uuid4().hex[:12]}")
    try:
        rows.write_parquet(staging, partition_cols=[SPLIT])
        for s in SPLITS:
            src = join(staging, f"{SPLIT}={s}")
            if os.path.isdir(src):
                os.replace(src, join(data_dir, f"{SPLIT}={s}"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Reading the output


def load_split_arrays(
    manifest: Manifest, split: str, endpoint_url: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features float32 [n, d], labels int64 [n], sample_ids int64 [n]) sorted by sample_id.

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
    labels = table.column(LABEL).to_numpy().astype(np.int64)
    ids = table.column(SAMPLE_ID).to_numpy().astype(np.int64)
    if len(ids) != manifest.rows[split]:
        raise StorageError(
            f"{uri} holds {len(ids)} rows but its manifest says {manifest.rows[split]}; the data "
            f"directory was changed: delete {manifest.data_dir} to preprocess again"
        )
    order = np.argsort(ids, kind="stable")
    return features[order].astype(np.float32, copy=False), labels[order], ids[order]


def read_raw(files: list[str], fmt: str, endpoint_url: str | None = None) -> ray.data.Dataset:
    """New raw rows (every column) as a Ray Dataset, read like the training input."""
    import ray.data

    fs, paths = None, files
    if is_remote(files[0]):
        fs = filesystem(files[0], endpoint_url)[0]
        paths = [filesystem(f, endpoint_url)[1] for f in files]
    if fmt == "parquet":
        return _read_parquet(paths, fs, None)
    return ray.data.read_csv(paths, filesystem=fs, file_extensions=None, partitioning=None)


def read_split(manifest: Manifest, split: str, endpoint_url: str | None = None) -> ray.data.Dataset:
    """One split as a Ray Dataset with columns features/label/sample_id."""
    uri = manifest.split_uris[split]
    fs, path = filesystem(uri, endpoint_url)
    listing = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted(i.path for i in listing if i.type == pafs.FileType.File)
    return _read_parquet(files, fs if is_remote(uri) else None, [FEATURES, LABEL, SAMPLE_ID])
