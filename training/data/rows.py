"""Row-level pieces of preprocessing: each row's seeded hash (its identity and split), and the
raw rows -> tensors transform applied in Ray Data. The transform itself is the registered model's
(``trainflow_pyfunc.transform``): the network is trained and served on the same numbers; here it
gets training's error type and training's wording for a missing column."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from training.config import SplitConfig
from training.data.columns import BATCH, require_columns
from training.data.token_lists import token_lists
from training.errors import DataValidationError
from training.manifest import FEATURES, LABEL, SAMPLE_ID, FeatureSpec
from training.model.trainflow_pyfunc import transform
from training.model.trainflow_pyfunc.transform import TransformError
from training.model.trainflow_pyfunc.transform_steps import category_keys, parse_datetimes

#: The column of the written rows that names their split (a partition directory once written).
SPLIT = "split"
#: The roles of the columns a table's rows are read (and hashed) by.
_READ_ROLES = ("numeric", "categorical", "datetime")


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


@contextlib.contextmanager
def _as_data_errors() -> Iterator[None]:
    """The shared transform's refusal, as training's error (one message, naming the column)."""
    try:
        yield
    except TransformError as exc:
        raise DataValidationError(str(exc)) from None


def feature_matrix(
    batch: pd.DataFrame, feature_columns: list[str] | None, image_column: str | None
) -> np.ndarray:
    """Raw rows -> float64 [n, width], before normalisation (the shipped transform's)."""
    wanted = [] if image_column else list(feature_columns or [])
    require_columns(BATCH, batch.columns, image=image_column, features=wanted)
    columns = {"feature_columns": feature_columns, "image_column": image_column}
    with _as_data_errors():
        return transform.raw_matrix(batch, columns)


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
    roles: dict[str, str] | None = None,
) -> np.ndarray:
    """A seeded 64-bit hash (uint64) of each row's features and label: its identity and split.

    ``roles`` (a table's columns by role) hashes every column read, raw: numbers (gaps as NaN),
    categories as their text, datetimes as instants."""
    if roles and not image_column:
        return hash_rows(raw_values(batch, roles), labels_of(batch, label_column), seed)
    raw = feature_matrix(batch, feature_columns, image_column)
    return hash_rows(raw, labels_of(batch, label_column), seed)


def hash_roles(spec: FeatureSpec | dict) -> dict[str, str]:
    """The columns a spec's rows were hashed by, by role (what the plan read)."""
    plain = spec if isinstance(spec, dict) else spec.to_dict()
    read = {"id-like": "categorical", "text": "categorical"}
    roles = dict(plain.get("column_roles") or {})
    for column in plain.get("datetime_found") or {}:  # read as text, found dates after hashing
        roles[column] = "categorical"
    hashed = {c: read.get(r, r) for c, r in roles.items() if read.get(r, r) in _READ_ROLES}
    return hashed or {c: "numeric" for c in plain.get("feature_columns") or []}


def raw_values(batch: pd.DataFrame, roles: dict[str, str]) -> pd.DataFrame:
    """A table's columns read, raw, as a frame to hash: numbers first (a numeric table hashes
    as it always did), then categories as text and datetimes as int64 nanoseconds."""
    require_columns(BATCH, batch.columns, features=list(roles))
    numeric = [c for c, r in roles.items() if r == "numeric"]
    with _as_data_errors():
        frame = pd.DataFrame(transform.numbers(batch, numeric))
        for column, role in roles.items():
            if role in ("categorical", "text"):  # declared text hashes as inferred text does
                keys = category_keys(batch[column])
                frame[frame.shape[1]] = keys.to_numpy(dtype=object, na_value=None)
            elif role == "datetime":
                parsed = parse_datetimes(batch[column], column).dt.tz_localize(None)
                frame[frame.shape[1]] = parsed.to_numpy("datetime64[ns]").view(np.int64)
    return frame


def hash_rows(raw: np.ndarray | pd.DataFrame, labels: pd.Series, seed: int) -> np.ndarray:
    """``row_hashes`` of a feature matrix (or raw-value frame) already built."""
    frame = raw if isinstance(raw, pd.DataFrame) else pd.DataFrame(raw)
    frame[frame.shape[1]] = _hashable_labels(labels)
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


def labelled_rows(table, label_column: str):
    """An Arrow batch without its rows that have no label (``data.missing_label: drop``)."""
    import pyarrow as pa

    return table.filter(pa.array(~missing_labels(table.column(label_column).to_pandas())))


def labels_of(batch: pd.DataFrame, column: str) -> pd.Series:
    """The label column of a batch, or an error naming it and the batch's columns."""
    require_columns(BATCH, batch.columns, label=column)
    return batch[column]


def _require(
    batch: pd.DataFrame, spec: FeatureSpec, with_labels: bool, plain: dict | None = None
) -> None:
    """Training's wording for a missing column (it names the setting to fix)."""
    label = spec.label_column if with_labels else None
    plain = plain or spec.to_dict()
    features = [] if spec.image_column else transform.input_columns(plain)
    require_columns(BATCH, batch.columns, label=label, image=spec.image_column, features=features)


def transform_batch(
    batch: pd.DataFrame, spec: FeatureSpec, with_labels: bool
) -> dict[str, np.ndarray]:
    """Raw rows -> {"features": float32 [n, num_features], "label": int64 [n]} (label optional;
    a regression's label is float32, normalised by the train split's label mean and std): the
    transform the registered model applies."""
    plain = spec.to_dict()
    _require(batch, spec, with_labels, plain)
    with _as_data_errors():
        return transform.transform(batch, plain, with_labels)


def normalise_labels(labels: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """A regression's labels in the unit the model learns: minus the train mean, over its std."""
    return transform.label_units(labels, spec.to_dict())


def denormalise_labels(values: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The inverse of :func:`normalise_labels`: model outputs back in the label's own unit."""
    return transform.label_values(values, spec.to_dict())


def output_rows(batch: pd.DataFrame, spec: FeatureSpec, split: SplitConfig) -> pa.Table:
    """Raw rows -> the rows preprocessing writes: features, label, sample_id and split."""
    plain, labels = spec.to_dict(), labels_of(batch, spec.label_column)
    _require(batch, spec, with_labels=True, plain=plain)
    with _as_data_errors():  # transform_batch's steps, keeping the matrix the hashes are taken of
        raw = transform.raw_matrix(batch, plain)
        # A language model's targets are its own ids (below), not the label column.
        out = transform.tensors(raw, None if spec.task == "causal_lm" else labels, plain)
    if spec.image_column or not spec.column_roles:
        hashes = hash_rows(raw, labels, split.seed)
    else:
        hashes = hash_rows(raw_values(batch, hash_roles(plain)), labels, split.seed)
    if spec.tokens:  # token ids: each row its own length, padded per batch when read
        vectors = token_lists(out[transform.FEATURES])
        if spec.task == "causal_lm":  # the targets are the ids themselves (shifted in the loss)
            out[transform.LABEL] = np.zeros(len(batch), dtype=np.int64)
    else:  # a plain fixed-size list (not Ray's tensor type): pyarrow alone reads it back
        features = out[transform.FEATURES].ravel()
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(features), spec.num_features)
    return pa.table(
        {
            FEATURES: vectors,
            LABEL: out[transform.LABEL],
            SAMPLE_ID: hashes.view(np.int64),
            SPLIT: assign_splits(hashes, split),
        }
    )
