"""Every file form read by Ray Data, as training's splits and ``trainflow predict`` read them:
the same rows and types as read here with pyarrow, a folder mixing forms read whole, an Excel
workbook as the same table written as CSV."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.unit.test_file_formats import FORMS, ROWS, TYPES, _write
from tests.unit.test_workbooks import DATED, MIDNIGHTS, SAME, write_csv, write_xlsx
from training.config import DataConfig
from training.data.inputs import input_format, resolve_inputs
from training.data.read import read_input, read_raw
from training.data.schema import Plan, check_schema

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("suffix", FORMS)
def test_serving_reads_each_form_with_the_same_types(ray_local, tmp_path, suffix):
    """``read_raw`` is what ``trainflow predict`` and scheduled scoring read rows with."""
    path = _write(tmp_path, suffix)
    fmt = input_format(DataConfig(source=path), [path])
    table = pa.concat_tables(read_raw([path], fmt).iter_batches(batch_format="pyarrow"))
    assert {name: table.schema.field(name).type for name in TYPES} == TYPES
    assert sorted(table.select(list(TYPES)).to_pylist(), key=str) == sorted(ROWS, key=str)


def test_a_folder_of_mixed_forms_is_read_whole_with_the_planned_types(ray_local, tmp_path):
    for suffix in (".json", ".jsonl.gz", ".json.gz"):
        _write(tmp_path, suffix)
    data = DataConfig(source=str(tmp_path))
    files = resolve_inputs(data)
    plan = Plan(input_format(data, files), "label", ["x"], None)
    table = pa.concat_tables(read_input(files, plan, None).iter_batches(batch_format="pyarrow"))
    assert table.schema.names == ["x", "label"]
    assert table.schema.field("x").type == pa.float64()  # the plan's type for a numeric column
    assert table.num_rows == 3 * len(ROWS)
    assert sorted(table.column("x").to_pylist()) == sorted([r["x"] for r in ROWS] * 3)


def _rows(dataset) -> pa.Table:
    return pa.concat_tables(dataset.iter_batches(batch_format="pyarrow"))


def test_a_workbook_is_read_for_training_and_serving_as_its_csv(ray_local, tmp_path):
    other = [{"x": 9, "label": "z"}]
    xlsx = write_xlsx(tmp_path / "t.xlsx", {"notes": other, "data": DATED})
    csv = write_csv(tmp_path / "t.csv", DATED)
    served = _rows(read_raw([xlsx], "xlsx", sheet="data"))
    expected = _rows(read_raw([csv], "csv"))
    assert served.schema.names == expected.schema.names
    assert served.select(SAME).schema == expected.select(SAME).schema
    assert served.select(SAME).to_pylist() == expected.select(SAME).to_pylist()
    assert served.column("day").to_pylist() == MIDNIGHTS
    assert _rows(read_raw([xlsx], "xlsx")).to_pylist() == other  # the first sheet
    planned = {}
    for path, sheet in ((xlsx, 1), (csv, None)):
        data = DataConfig(source=path, sheet=sheet)
        plan = check_schema(data, [path], input_format(data, [path]), None)
        planned[path] = _rows(read_input([path], plan, None))
    table, expected = planned[xlsx], planned[csv]
    assert table.schema.names == expected.schema.names == ["x", "w", "kind", "day", "label"]
    assert table.select(SAME).schema == expected.select(SAME).schema
    assert table.select(SAME).to_pylist() == expected.select(SAME).to_pylist()
    # A date cell stays a timestamp, as parquet's does (the CSV's text is parsed later).
    assert table.schema.field("day").type == pa.timestamp("us")
    assert table.column("day").to_pylist() == MIDNIGHTS
