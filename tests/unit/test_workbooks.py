"""Excel workbooks (``.xlsx``), written here with openpyxl, read as the other forms are: the
same rows and types as the same table written as CSV (numbers, a category, gaps), dates as
timestamps (as parquet's), the first sheet or ``data.sheet`` by name or index, and one-line
refusals of a missing sheet and of an old ``.xls``."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pytest
from pydantic import ValidationError

from tests.unit.test_file_formats import ROWS
from training.config import DataConfig
from training.data.formats import file_schema, iter_batches, read_table
from training.data.inputs import input_format, resolve_inputs
from training.data.schema import check_schema
from training.errors import ConfigError, DataValidationError

FS = pafs.LocalFileSystem()
#: ROWS with a date column (and a gap in it).
DAYS = [datetime.date(2024, 1, 31), None, datetime.date(2024, 2, 29)]
DATED = [{**row, "day": day} for row, day in zip(ROWS, DAYS, strict=True)]
#: The columns read with the same types as from CSV; the dates are timestamps, at midnight.
SAME = ["x", "w", "kind", "label"]
MIDNIGHTS = [None if d is None else datetime.datetime.combine(d, datetime.time()) for d in DAYS]


def write_xlsx(path, sheets: dict[str, list[dict]]) -> str:
    """A workbook of one sheet per entry, each a header row then the rows (a date as Excel
    stores one: a datetime cell with a date format)."""
    import openpyxl

    book = openpyxl.Workbook()
    book.remove(book.active)
    for name, rows in sheets.items():
        sheet = book.create_sheet(name)
        columns = list(rows[0])
        sheet.append(columns)
        for row in rows:
            sheet.append([_cell(row[c]) for c in columns])
    book.save(path)
    return str(path)


def _cell(value):
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return datetime.datetime.combine(value, datetime.time())
    return value


def write_csv(path, rows: list[dict]) -> str:
    pacsv.write_csv(pa.Table.from_pylist(rows), str(path))
    return str(path)


def test_a_workbook_reads_as_the_same_table_written_as_csv(tmp_path):
    xlsx = write_xlsx(tmp_path / "t.xlsx", {"data": DATED})
    csv = write_csv(tmp_path / "t.csv", DATED)
    assert input_format(DataConfig(source=xlsx), [xlsx]) == "xlsx"
    expected = read_table(FS, csv, "csv")
    table = read_table(FS, xlsx, "xlsx")
    assert table.schema.names == expected.schema.names
    assert table.select(SAME).schema == expected.select(SAME).schema
    assert table.select(SAME).to_pylist() == expected.select(SAME).to_pylist() == ROWS
    assert table.schema.field("day").type == pa.timestamp("us")
    assert table.column("day").to_pylist() == MIDNIGHTS
    batches = pa.Table.from_batches(list(iter_batches(FS, xlsx, "xlsx", ["label", "day"])))
    labels = [r["label"] for r in ROWS]
    assert batches.to_pylist() == [
        {"label": r, "day": d} for r, d in zip(labels, MIDNIGHTS, strict=True)
    ]
    schema, rows = file_schema(FS, xlsx, "xlsx")
    assert schema == table.schema and rows == len(DATED)


def test_planned_types_apply_and_dates_stay_dates(tmp_path):
    xlsx = write_xlsx(tmp_path / "t.xlsx", {"data": DATED})
    plan = check_schema(DataConfig(source=xlsx), [xlsx], "xlsx", None)
    assert plan.roles == {"x": "numeric", "w": "numeric", "kind": "categorical", "day": "datetime"}
    types = {"x": pa.float64(), "kind": pa.string(), "day": pa.string()}
    table = read_table(FS, xlsx, "xlsx", ["x", "day", "label"], types)
    assert table.schema.names == ["x", "day", "label"]
    assert table.schema.field("x").type == pa.float64()
    assert table.schema.field("day").type == pa.timestamp("us")  # as parquet's stays one


def test_times_and_mixed_cells(tmp_path):
    at = datetime.datetime(2024, 3, 1, 10, 30)
    rows = [{"t": at, "code": 7, "label": "a"}, {"t": None, "code": "B7", "label": "b"}]
    table = read_table(FS, write_xlsx(tmp_path / "t.xlsx", {"s": rows}), "xlsx")
    assert pa.types.is_timestamp(table.schema.field("t").type)
    assert table.column("t").to_pylist() == [at, None]
    assert table.column("code").to_pylist() == ["7", "B7"]  # numbers and text: text


def test_data_sheet_chooses_by_name_or_index(tmp_path):
    other = [{"x": 9, "label": "z"}]
    xlsx = write_xlsx(tmp_path / "t.xlsx", {"notes": other, "data": DATED})
    assert read_table(FS, xlsx, "xlsx").to_pylist() == other  # the first sheet
    for sheet in ("data", 1):
        assert read_table(FS, xlsx, "xlsx", ["x"], sheet=sheet).column("x").to_pylist() == [
            1,
            2,
            3,
        ]
        plan = check_schema(DataConfig(source=xlsx, sheet=sheet), [xlsx], "xlsx", None)
        assert plan.sheet == sheet and "day" in plan.roles


def test_a_missing_sheet_is_refused_naming_the_sheets_there(tmp_path):
    xlsx = write_xlsx(tmp_path / "t.xlsx", {"notes": DATED, "data": DATED})
    for sheet in ("Data", 2):
        with pytest.raises(ConfigError) as err:
            check_schema(DataConfig(source=xlsx, sheet=sheet), [xlsx], "xlsx", None)
        message = str(err.value)
        assert "\n" not in message and f"data.sheet {sheet!r}" in message
        assert "'notes', 'data'" in message
    with pytest.raises(ValidationError, match="counts from 0"):
        DataConfig(sheet=-1)


def test_an_old_xls_workbook_is_refused_in_one_line(tmp_path):
    path = tmp_path / "table.xls"
    path.write_bytes(b"\xd0\xcf\x11\xe0")
    with pytest.raises(DataValidationError) as err:
        resolve_inputs(DataConfig(source=str(path)))
    message = str(err.value)
    assert "\n" not in message and ".xlsx" in message and "CSV" in message


def test_a_folder_lists_workbooks_and_a_broken_one_is_named(tmp_path):
    write_xlsx(tmp_path / "a.xlsx", {"data": DATED})
    (tmp_path / "b.xlsx").write_bytes(b"not a zip")
    files = resolve_inputs(DataConfig(source=str(tmp_path)))
    assert [f.rsplit("/", 1)[1] for f in files] == ["a.xlsx", "b.xlsx"]
    with pytest.raises(DataValidationError, match="b.xlsx is not a readable .xlsx workbook"):
        read_table(FS, files[1], "xlsx")
