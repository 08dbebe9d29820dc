"""A manifest read back keeps its column order: a row's split is the hash of its columns in the
order of ``spec.column_roles``, so a cached run that reads the manifest again must find the very
rows preprocessing assigned to each split."""

from __future__ import annotations

import numpy as np
import pandas as pd

from training.data.rows import hash_roles, raw_values, row_hashes
from training.manifest import FeatureSpec, Manifest

ROLES = {"zeta": "numeric", "alpha": "categorical", "mid": "numeric"}


def _manifest() -> Manifest:
    spec = FeatureSpec(
        label_column="label",
        classes=[0, 1],
        input_shape=[3],
        mean=[0.0] * 3,
        std=[1.0] * 3,
        column_roles=ROLES,
        categories={"zeta_cat": ["b", "a"], "alpha": ["y", "x"]},
    )
    return Manifest("f", "src", "d", {}, {}, {}, spec)


def test_the_roles_and_vocabularies_read_back_in_their_order():
    again = Manifest.from_json(_manifest().to_json())
    assert list(again.spec.column_roles) == ["zeta", "alpha", "mid"]
    assert list(again.spec.categories) == ["zeta_cat", "alpha"]
    assert again.spec.categories["zeta_cat"] == ["b", "a"]


def test_a_read_back_manifest_hashes_rows_as_preprocessing_did():
    rng = np.random.default_rng(0)
    batch = pd.DataFrame(
        {
            "zeta": rng.normal(size=50),
            "alpha": rng.choice(["x", "y"], size=50),
            "mid": rng.normal(size=50),
            "label": rng.integers(0, 2, size=50),
        }
    )
    before, after = _manifest().spec, Manifest.from_json(_manifest().to_json()).spec
    hashed = [
        row_hashes(batch, label_column="label", seed=3, roles=hash_roles(spec))
        for spec in (before, after)
    ]
    np.testing.assert_array_equal(hashed[0], hashed[1])
    # The order matters: the same columns hashed alphabetically give other splits.
    shuffled = dict(sorted(hash_roles(before).items()))
    assert not np.array_equal(
        hashed[0], row_hashes(batch, label_column="label", seed=3, roles=shuffled)
    )
    assert list(raw_values(batch, hash_roles(after)).columns) == [0, 1, 2]
