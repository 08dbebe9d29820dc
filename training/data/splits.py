"""A split's raw rows found again: the input's own columns, as a user would send them.

Preprocessing assigns each row to a split by a seeded row hash; the same hash, over the same
input read by :mod:`training.data.read`, finds a split's raw rows again (for the model's input
example and for scoring the split through the model).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from training.errors import DataValidationError
from training.manifest import FeatureSpec, Manifest

#: Rows per batch, at most, when a split's raw rows are found (hashed), and a batch's float64
#: feature matrix stays near this size (1M-row table, 2 cores: the split found in 2.0 s with
#: 65,536-row Arrow batches, 10 s with 4,096-row pandas ones).
FIND_BATCH_ROWS = 65_536
FIND_BATCH_BYTES = 64 * 1024**2


def _rows_of_split(batch: pd.DataFrame, spec: dict, split_config: dict, split: str):
    """The rows of a pandas batch that preprocessing assigned to ``split``."""
    return batch[_in_split(batch, spec, split_config, split)].reset_index(drop=True)


def _arrow_rows_of_split(table, spec: dict, split_config: dict, split: str):
    """``_rows_of_split`` of an Arrow batch, which stays Arrow (Ray Data's fast path): pandas
    batches of ArrowDtype columns, hashed and rebuilt, took 5x as long (10 s for 1M rows)."""
    import pyarrow as pa

    return table.filter(pa.array(_in_split(table.to_pandas(), spec, split_config, split)))


def _in_split(batch: pd.DataFrame, spec: dict, split_config: dict, split: str) -> np.ndarray:
    from training.config import SplitConfig
    from training.data.rows import assign_splits, hash_roles, labels_of, missing_labels, row_hashes

    cfg = SplitConfig(**split_config)
    hashes = row_hashes(
        batch,
        label_column=spec["label_column"],
        feature_columns=spec["feature_columns"],
        image_column=spec["image_column"],
        seed=cfg.seed,
        roles=None if spec["image_column"] else hash_roles(spec),
    )
    # A row without a label is in no split: preprocessing refused it or dropped it.
    labelled = ~missing_labels(labels_of(batch, spec["label_column"]))
    return (assign_splits(hashes, cfg) == split) & labelled


def batch_rows(spec: FeatureSpec, most: int, budget_bytes: int) -> int:
    """Rows per Ray Data batch of raw rows: ``most``, fewer for wide rows (images), so that a
    batch's float64 feature matrix stays near ``budget_bytes``."""
    return max(64, min(most, budget_bytes // (8 * max(1, spec.num_features))))


def _input_plan(manifest: Manifest, endpoint_url: str | None):
    """(data config, input files, read plan) as preprocessing had them."""
    from training.config import DataConfig
    from training.data.formats import IMAGES
    from training.data.inputs import input_format
    from training.data.schema import Plan, check_schema

    spec = manifest.spec
    data = DataConfig(**manifest.preprocessing)
    files = list(manifest.input_files)
    from training.data.rows import hash_roles

    fmt = input_format(data, files)
    if spec.image_column and fmt != IMAGES:  # an image table: arrays, or paths to decode
        return data, files, check_schema(data, files, fmt, endpoint_url)
    roles = {} if spec.image_column else hash_roles(spec)
    plan = Plan(
        fmt,
        spec.label_column,
        spec.feature_columns,
        spec.image_column,
        roles,
        image_shape=list(spec.input_shape) if spec.image_column else None,
        sheet=data.sheet,
    )
    return data, files, plan


def raw_split(manifest: Manifest, split: str, endpoint_url: str | None = None):
    """The raw rows of one split (the input's own columns), read as preprocessing read them."""
    from training.data.read import read_input

    spec = manifest.spec
    data, files, plan = _input_plan(manifest, endpoint_url)
    return read_input(files, plan, endpoint_url).map_batches(
        _arrow_rows_of_split,
        fn_kwargs={"spec": spec.to_dict(), "split_config": data.split.model_dump(), "split": split},
        batch_format="pyarrow",
        batch_size=batch_rows(spec, FIND_BATCH_ROWS, FIND_BATCH_BYTES),
    )


def raw_split_here(manifest: Manifest, split: str, endpoint_url: str | None = None):
    """The raw rows of one split as pandas batches, read in this process (small inputs)."""
    from training.data.read import input_batches

    spec = manifest.spec
    data, files, plan = _input_plan(manifest, endpoint_url)
    for batch in input_batches(files, plan, endpoint_url):
        yield _rows_of_split(batch, spec.to_dict(), data.split.model_dump(), split)


def raw_rows(manifest: Manifest, split: str, rows: int, endpoint_url: str | None = None):
    """A few raw rows of a split (the model's input example and signature types).

    Read here with pyarrow, batch by batch, until enough rows of the split turned up: a Ray
    Data pass for five rows cost seconds of task start-up per call on a small table.
    """
    found: list[pd.DataFrame] = []
    for batch in raw_split_here(manifest, split, endpoint_url):
        found.append(batch)
        if sum(len(f) for f in found) >= rows:
            break
    if not found:
        raise DataValidationError(f"the {split} split is empty; use more data or a larger split")
    return pd.concat(found, ignore_index=True).head(rows)
