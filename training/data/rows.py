"""Row-level pieces shared by preprocessing and prediction: raw rows -> a feature matrix,
each row's seeded hash (its identity and split), normalised features and class indices."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pandas as pd
import pyarrow as pa

from training.config import SplitConfig
from training.data.columns import BATCH, not_numeric, ragged, require_columns
from training.errors import DataValidationError
from training.manifest import FEATURES, LABEL, SAMPLE_ID, FeatureSpec

#: The column of the written rows that names their split (a partition directory once written).
SPLIT = "split"


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
    """An image column (arrow lists, a tensor column or numpy arrays) -> float64 [n, width]."""
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
                raise ragged(column, lengths)
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
        raise ragged(column, lengths)
    return np.stack(rows) if rows else np.zeros((0, 0))


def feature_matrix(
    batch: pd.DataFrame, feature_columns: list[str] | None, image_column: str | None
) -> np.ndarray:
    """Raw rows -> float64 [n, width], before normalisation."""
    wanted = [] if image_column else list(feature_columns or [])
    require_columns(BATCH, batch.columns, image=image_column, features=wanted)
    if image_column:
        return _matrix_from_column(batch[image_column], image_column)
    try:
        return batch[wanted].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):
        # Checked only on failure: an object column of numbers (decimals) converts fine.
        bad = [c for c in wanted if not pd.api.types.is_numeric_dtype(batch[c])]
        raise not_numeric(BATCH, {c: str(batch[c].dtype) for c in bad}) from None


def _hashable_labels(labels: pd.Series) -> np.ndarray:
    # int 3 and float 3.0 must hash alike: a batch with a null turns an int column into floats.
    if pd.api.types.is_numeric_dtype(labels):
        return labels.to_numpy(dtype=np.float64, na_value=np.nan)
    return labels.astype(object).to_numpy()


def missing_labels(labels: pd.Series) -> np.ndarray:
    """True where a row has no label (None, NA or NaN)."""
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
    raw = feature_matrix(batch, feature_columns, image_column)
    return hash_rows(raw, labels_of(batch, label_column), seed)


def hash_rows(raw: np.ndarray, labels: pd.Series, seed: int) -> np.ndarray:
    """``row_hashes`` of a feature matrix already built."""
    frame = pd.DataFrame(raw)
    frame[raw.shape[1]] = _hashable_labels(labels)
    key = _split_key(seed)
    hashed = pd.util.hash_pandas_object(frame, index=False, hash_key=key)
    return _keyed_mix(hashed.to_numpy(dtype=np.uint64), key)


def sample_keys(sample_ids: np.ndarray, seed: int) -> np.ndarray:
    """A seeded uint64 key per row id, independent of its split: the rows with the smallest keys
    are a deterministic uniform sample (the sweep's, ``sweep.sample_rows``)."""
    key = hashlib.sha256(f"trainflow-sample:{seed}".encode()).hexdigest()[:16]
    return _keyed_mix(np.ascontiguousarray(sample_ids).view(np.uint64), key)


def assign_splits(hashes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """train/val/test per row from its hash: u = hash / 2**64 against the split fractions."""
    u = hashes.astype(np.float64) / 2.0**64
    return np.where(u < split.test, "test", np.where(u < split.test + split.val, "val", "train"))


def labels_of(batch: pd.DataFrame, column: str) -> pd.Series:
    """The label column of a batch, or an error naming it and the batch's columns."""
    require_columns(BATCH, batch.columns, label=column)
    return batch[column]


def transform_batch(
    batch: pd.DataFrame, spec: FeatureSpec, with_labels: bool
) -> dict[str, np.ndarray]:
    """Raw rows -> {"features": float32 [n, num_features], "label": int64 [n]} (label optional;
    a regression's label is float32, normalised by the train split's label mean and std)."""
    raw = feature_matrix(batch, spec.feature_columns, spec.image_column)
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
    if with_labels and spec.is_regression:
        labels = labels_of(batch, spec.label_column).to_numpy(dtype=np.float64, na_value=np.nan)
        out["label"] = normalise_labels(labels, spec).astype(np.float32)
    elif with_labels:
        labels = labels_of(batch, spec.label_column)
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


def normalise_labels(labels: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """A regression's labels in the unit the model learns: minus the train mean, over its std."""
    return (np.asarray(labels, dtype=np.float64) - spec.label_mean) / spec.label_std


def denormalise_labels(values: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The inverse of :func:`normalise_labels`: model outputs back in the label's own unit."""
    return np.asarray(values, dtype=np.float64) * spec.label_std + spec.label_mean


def output_rows(batch: pd.DataFrame, spec: FeatureSpec, split: SplitConfig) -> pa.Table:
    """Raw rows -> the rows preprocessing writes: features, label, sample_id and split."""
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
