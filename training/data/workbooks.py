"""Reading one sheet of an Excel workbook (``.xlsx``) as an Arrow table, with openpyxl.

A workbook is a zip of XML parts, not a stream of rows: the whole file is read into memory on
the reading process, and the sheet's cells become columns there. The first row holds the column
names. Cells keep their types: numbers are numbers (int64 where every value is whole, else
float64), text is text, an empty cell is a gap, and a date cell (Excel stores a date as a
date and time) is a timestamp, read as a parquet timestamp is: by its type, never parsed as
text. A column mixing kinds of values (numbers and text) is read as text.
"""

from __future__ import annotations

import datetime
import io

import pyarrow as pa

from training.errors import ConfigError, DataValidationError

#: ``data.format`` of a workbook, and the suffix it is told by.
XLSX = "xlsx"


def read_sheet(
    fs,
    path: str,
    sheet: str | int | None = None,
    columns: list[str] | None = None,
    types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """The sheet ``sheet`` (a name, a 0-based index; None: the first) of the workbook at
    ``path`` as a table of ``columns`` (None: all), with the planned ``types`` (a date cell's
    column stays a timestamp, as in parquet)."""
    rows = _sheet_rows(fs, path, sheet)
    header = [_name(value, i) for i, value in enumerate(rows[0])] if rows else []
    body = [row for row in rows[1:] if any(v is not None for v in row)]
    cells = [[row[i] if i < len(row) else None for row in body] for i in range(len(header))]
    table = pa.Table.from_arrays([_column(values) for values in cells], names=header)
    if columns is not None:
        table = table.select([c for c in columns if c in table.schema.names])
    return _typed(table, types or {}, path)


def _sheet_rows(fs, path: str, sheet: str | int | None) -> list[tuple]:
    """Every row of the chosen sheet, as cell values (formulas as their last computed value)."""
    import zipfile

    import openpyxl

    with fs.open_input_stream(path) as stream:
        data = stream.read()
    try:
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise DataValidationError(
            f"{path} is not a readable .xlsx workbook ({exc}); save it again as .xlsx or CSV"
        ) from None
    try:
        return list(book[_sheet_name(book.sheetnames, sheet, path)].iter_rows(values_only=True))
    finally:
        book.close()


def _sheet_name(names: list[str], sheet: str | int | None, path: str) -> str:
    """The name of the sheet ``data.sheet`` chooses; a config error naming the sheets there."""
    if sheet is None and names:
        return names[0]
    if isinstance(sheet, int) and 0 <= sheet < len(names):
        return names[sheet]
    if isinstance(sheet, str) and sheet in names:
        return sheet
    there = ", ".join(repr(name) for name in names) or "none"
    raise ConfigError(
        f"data.sheet {sheet!r} is not a sheet of {path} (its sheets: {there}); set data.sheet "
        "to one of those names or a 0-based index"
    )


def _name(value, index: int) -> str:
    """A header cell as a column name; an empty one names the column by its position."""
    return f"column_{index + 1}" if value is None else str(value).strip()


def _column(values: list) -> pa.Array:
    """One column's cells as an array of their own type (see the module's docstring)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, datetime.date) for v in present):
        return pa.array([_instant(v) for v in values], pa.timestamp("us"))
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # numbers and text: text, as CSV reads it
        return pa.array([v if v is None else _text(v) for v in values], pa.string())


def _instant(value):
    """A date cell as a datetime (a cell formatted as a date alone is its midnight)."""
    if value is None or isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.combine(value, datetime.time())


def _text(value) -> str:
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _typed(table: pa.Table, types: dict[str, pa.DataType], path: str) -> pa.Table:
    """The planned types, as the CSV reader applies them; a date column keeps its type (the
    plan reads dates written as text as text, while a parquet timestamp stays one)."""
    for name, wanted in types.items():
        if name not in table.schema.names:
            continue
        index = table.schema.get_field_index(name)
        found = table.schema.field(index).type
        if found == wanted or pa.types.is_temporal(found):
            continue
        try:
            table = table.set_column(index, name, table.column(index).cast(wanted))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataValidationError(
                f"column {name!r} of {path} cannot be read as {wanted} ({exc}); fix the cells "
                "or declare the column's role in data.columns"
            ) from None
    return table
