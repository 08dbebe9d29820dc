"""A real table as users hold it, preprocessed with Ray Data: the Palmer penguins (text
categories, 19 empty cells), as parquet and as CSV: every column gets a role, gaps are imputed,
the rows of each split are found again from the raw file by their hash."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from training.config import DataConfig, PipelineConfig
from training.data.builtin import BUILTIN_PENGUINS
from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import preprocess
from training.data.read import load_split_arrays
from training.data.splits import raw_split, raw_split_here
from training.manifest import SPLITS
from training.storage import StorageLayout

pytestmark = pytest.mark.integration

ROLES = {
    "island": "categorical",
    "bill_length_mm": "numeric",
    "bill_depth_mm": "numeric",
    "flipper_length_mm": "numeric",
    "body_mass_g": "numeric",
    "sex": "categorical",
    "year": "numeric",
}


def _run(data: DataConfig, root):
    config = PipelineConfig(data=data)
    files = resolve_inputs(config.data)
    return preprocess(config, StorageLayout(root=str(root)), fingerprint(config.data, files), files)


@pytest.fixture(scope="module")
def penguins(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("storage")
    return _run(DataConfig(source=BUILTIN_PENGUINS, label_column="species"), root)


def test_every_column_gets_its_role_and_gaps_are_imputed(penguins):
    spec = penguins.spec
    assert sum(penguins.rows.values()) == 344
    assert spec.column_roles == ROLES
    assert spec.classes == ["Adelie", "Chinstrap", "Gentoo"]
    assert set(spec.categories) == {"island", "sex"}
    assert set(spec.categories["island"]) == {"Biscoe", "Dream", "Torgersen"}
    assert spec.indicator_columns == [
        "bill_length_mm",
        "bill_depth_mm",
        "flipper_length_mm",
        "body_mass_g",
    ]
    assert spec.cardinalities.count(0) == len(spec.mean) - 2
    assert sorted(c for c in spec.cardinalities if c) == [4, 5]
    for split in SPLITS:
        x, _, _ = load_split_arrays(penguins, split)
        assert x.shape == (penguins.rows[split], len(spec.mean))
        assert np.isfinite(x).all()


def test_the_spec_carries_the_train_split_as_a_drift_reference(penguins):
    from training.data import drift

    reference = penguins.spec.drift_reference
    numeric = [c for c, r in ROLES.items() if r == "numeric"]
    assert sorted(reference["numeric"]) == sorted(numeric)
    assert set(reference["categorical"]) == {"island", "sex"}
    island = reference["categorical"]["island"]
    assert set(island["shares"]) == {"Biscoe", "Dream", "Torgersen"}
    assert sum(island["shares"].values()) + island["missing"] == pytest.approx(1.0)
    assert reference["categorical"]["sex"]["missing"] > 0  # the empty cells of 'sex'
    bill = reference["numeric"]["bill_length_mm"]
    assert len(bill["quantiles"]) == drift.QUANTILES and 0 < bill["missing"] < 0.05
    assert 30 < bill["quantiles"][50] < 50  # the median bill, in mm
    assert all(d.psi == 0.0 for d in drift.compare(reference, reference))


def test_the_raw_rows_of_a_split_are_found_again(penguins):
    here = pd.concat(list(raw_split_here(penguins, "test")))
    assert len(here) == penguins.rows["test"]
    raw = raw_split(penguins, "test").to_pandas()  # Ray Data's, the evaluate stage's
    assert len(raw) == penguins.rows["test"]
    assert set(raw.columns) >= set(ROLES)


def test_the_csv_file_gives_the_same_roles_and_split(penguins, tmp_path):
    table = pq.read_table(penguins.input_files[0])
    path = str(tmp_path / "penguins.csv")
    pacsv.write_csv(table, path)
    from_csv = _run(DataConfig(source=path, label_column="species"), tmp_path / "storage")
    assert from_csv.spec.column_roles == ROLES
    assert from_csv.rows == penguins.rows
    assert from_csv.spec.categories == penguins.spec.categories


def test_the_json_lines_file_gives_the_same_roles_and_split(penguins, tmp_path):
    """JSON lines as a user's export writes them: one object per line, null for a gap, the
    integer columns as JSON integers. Read by Ray Data (the splits) and by pyarrow here (the
    footer check, the summary, the raw rows of a split)."""
    frame = pq.read_table(penguins.input_files[0]).to_pandas()
    path = tmp_path / "penguins.jsonl"
    frame.to_json(path, orient="records", lines=True)
    from_json = _run(DataConfig(source=str(path), label_column="species"), tmp_path / "storage")
    assert from_json.spec.column_roles == ROLES
    assert from_json.rows == penguins.rows
    assert from_json.spec.categories == penguins.spec.categories
    assert from_json.spec.medians == penguins.spec.medians
    here = pd.concat(list(raw_split_here(from_json, "test")))
    assert len(here) == penguins.rows["test"]


def test_a_gzipped_json_array_and_a_tsv_give_the_same_roles_and_split(penguins, tmp_path):
    """Exports as they come: a pretty-printed JSON array of records, gzipped, and a
    tab-separated file: the same roles, categories, medians and split as the parquet."""
    frame = pq.read_table(penguins.input_files[0]).to_pandas()
    array = tmp_path / "penguins.json.gz"
    frame.to_json(array, orient="records", indent=1, compression="gzip")
    tsv = tmp_path / "penguins.tsv"
    frame.to_csv(tsv, sep="\t", index=False)
    for path in (array, tsv):
        data = DataConfig(source=str(path), label_column="species")
        read = _run(data, tmp_path / f"storage-{path.name}")
        assert read.spec.column_roles == ROLES
        assert read.rows == penguins.rows
        assert read.spec.categories == penguins.spec.categories
        assert read.spec.medians == penguins.spec.medians
