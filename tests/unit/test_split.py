"""Split assignment: a seeded hash of each row's content, independent of order and batching."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from training.config import SplitConfig
from training.data.rows import assign_splits, row_hashes


def _table(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.integers(0, 5, size=n),
            "label": rng.integers(0, 3, size=n),
        }
    )


def _splits(frame: pd.DataFrame, split: SplitConfig) -> np.ndarray:
    hashes = row_hashes(frame, label_column="label", feature_columns=["a", "b"], seed=split.seed)
    return assign_splits(hashes, split)


def test_same_rows_get_the_same_split_on_every_call():
    frame = _table(2000)
    split = SplitConfig(seed=3)
    first = _splits(frame, split)
    assert set(first) == {"train", "val", "test"}
    np.testing.assert_array_equal(first, _splits(frame.copy(), split))


def test_split_ignores_row_order_and_batch_boundaries():
    frame = _table(3000)
    split = SplitConfig()
    whole = _splits(frame, split)
    order = np.random.default_rng(1).permutation(len(frame))
    shuffled = frame.iloc[order].reset_index(drop=True)
    # Uneven batches, as Ray Data might hand them out.
    edges = [0, 7, 1000, 1001, 2500, len(frame)]
    pieces = [
        _splits(shuffled.iloc[lo:hi], split) for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    ]
    batched = np.concatenate(pieces)
    np.testing.assert_array_equal(batched, whole[order])


def test_int_and_float_labels_hash_alike():
    # Ray turns an int column into floats in a batch that holds a null: the split must not move.
    frame = _table(500)
    as_float = frame.assign(label=frame["label"].astype(np.float64))
    keys = {"label_column": "label", "feature_columns": ["a", "b"], "seed": 0}
    np.testing.assert_array_equal(row_hashes(frame, **keys), row_hashes(as_float, **keys))


def test_hash_depends_on_label_and_every_feature():
    frame = _table(200)
    keys = {"label_column": "label", "feature_columns": ["a", "b"], "seed": 0}
    base = row_hashes(frame, **keys)
    for column in ("a", "b", "label"):
        changed = frame.copy()
        changed.loc[0, column] = changed.loc[0, column] + 1
        after = row_hashes(changed, **keys)
        assert after[0] != base[0], column
        np.testing.assert_array_equal(after[1:], base[1:])


def test_another_seed_gives_another_assignment():
    frame = _table(10_000)
    a = _splits(frame, SplitConfig(seed=0))
    b = _splits(frame, SplitConfig(seed=1))
    # Independent draws agree on ~0.7^2 + 2 * 0.15^2 = 53.5% of rows.
    assert 0.45 < (a == b).mean() < 0.62


@pytest.mark.parametrize(("val", "test"), [(0.15, 0.15), (0.1, 0.3), (0.05, 0.05)])
def test_fractions_are_roughly_honoured(val, test):
    got = _splits(_table(10_000, seed=7), SplitConfig(val=val, test=test))
    # Binomial sd on 10k rows is at most 0.5%: 2% leaves no room for a wrong formula.
    assert abs((got == "val").mean() - val) < 0.02
    assert abs((got == "test").mean() - test) < 0.02
    assert abs((got == "train").mean() - (1 - val - test)) < 0.02


def test_assign_splits_thresholds():
    top = 2.0**64
    hashes = np.array([0, int(0.1 * top), int(0.2 * top), int(0.99 * top)], dtype=np.uint64)
    got = assign_splits(hashes, SplitConfig(val=0.15, test=0.15))
    assert got.tolist() == ["test", "test", "val", "train"]


def test_image_rows_hash_the_same_from_arrow_or_numpy_batches():
    rng = np.random.default_rng(0)
    images = rng.random((50, 16)).astype(np.float32)
    labels = rng.integers(0, 2, size=50)
    as_numpy = pd.DataFrame({"img": list(images), "label": labels})
    arrow = pa.table(
        {
            "img": pa.FixedSizeListArray.from_arrays(pa.array(images.ravel()), 16),
            "label": labels,
        }
    )
    # Ray Data hands fixed-size list columns to pandas UDFs as ArrowDtype series.
    as_arrow = arrow.to_pandas(types_mapper=pd.ArrowDtype)
    assert isinstance(as_arrow["img"].dtype, pd.ArrowDtype)
    keys = {"label_column": "label", "image_column": "img", "seed": 5}
    from_numpy = row_hashes(as_numpy, **keys)
    np.testing.assert_array_equal(row_hashes(as_arrow, **keys), from_numpy)
    images[3, 7] += 0.5
    changed = pd.DataFrame({"img": list(images), "label": labels})
    assert row_hashes(changed, **keys)[3] != from_numpy[3]
    assert len(set(from_numpy.tolist())) == 50
