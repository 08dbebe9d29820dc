"""Column roles: what each column of a table is to the network, from its type and the user's
``data.columns`` (on the driver, from the first file's schema), then from its values (the summary
pass, ``training.data.string_roles``: long strings with spaces, or mostly distinct values made of
words, are text; a string column of distinct codes is id-like).

Roles: numeric, categorical (strings, bools, dictionaries; an int column when declared),
datetime (timestamps and dates; a string column when declared), text (free text: inferred from
the values, or a string column declared ``text``); a column not used is named with its reason,
never dropped silently.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from training.config import DataConfig
from training.errors import DataValidationError

#: Why a column is not used, per role that leaves it out (printed and logged).
REASONS = {
    "id-like": "id-like (a distinct short code in nearly every row)",
    "ignore": "data.columns says ignore",
}
#: A role ``column_roles`` records for a column whose type no role reads.
UNSUPPORTED = "unsupported type"
FEATURE_ROLES = ("numeric", "categorical", "datetime", "text")
#: Columns the preprocess line names per role; more are counted.
NAMED_PER_ROLE = 5


def type_role(dtype: pa.DataType) -> str | None:
    """The role a column's type gives it (None: a type no role reads)."""
    if pa.types.is_dictionary(dtype):
        return "categorical"
    if pa.types.is_boolean(dtype) or pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "categorical"
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype):
        return "datetime"
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "numeric"
    if pa.types.is_null(dtype):  # a CSV block of empty cells: the summary pass finds it empty
        return "numeric"
    return None


def table_roles(
    file: str,
    schema: pa.Schema,
    data: DataConfig,
    fmt: str,
    endpoint_url: str | None,
    only: list[str] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(column -> role for every column read, column -> reason for each column left out);
    ``only``: the columns of data.feature_columns (default: every column but the label)."""
    unknown = [c for c in data.columns if c not in schema.names]
    if unknown:
        raise DataValidationError(
            f"data.columns names {unknown} but {file} has no such column; its columns are "
            f"{schema.names[:20]}. Fix the names in data.columns"
        )
    candidates = only or [c for c in schema.names if c != data.label_column]
    roles: dict[str, str] = {}
    ignored: dict[str, str] = {}
    for column in candidates:
        dtype = schema.field(column).type
        declared = data.columns.get(column)
        found = type_role(dtype)
        if declared == "ignore":
            ignored[column] = REASONS["ignore"]
        elif declared is not None:
            _check_declared(file, column, declared, dtype, fmt, endpoint_url, data.sheet)
            roles[column] = declared
        elif found is None:
            ignored[column] = f"its type {dtype} is not a table column trainflow reads"
        else:
            roles[column] = found
    if not roles:
        raise DataValidationError(
            f"no feature column is left in {file} (label {data.label_column!r}; left out: "
            f"{ignored or 'none'}); add feature columns or change data.columns"
        )
    return roles, ignored


def _check_declared(
    file: str,
    column: str,
    role: str,
    dtype: pa.DataType,
    fmt: str,
    endpoint_url: str | None,
    sheet: str | int | None = None,
) -> None:
    """A declared role the column's type can hold: numbers for numeric, text or dates for
    datetime, strings for text (a parquet file's text is read and checked per value later)."""
    found = type_role(dtype)
    strings = pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
    if role == "text" and not strings and not pa.types.is_null(dtype):
        example = first_value(file, column, fmt, endpoint_url, sheet)
        raise DataValidationError(
            f"column {column!r} is declared text but holds {dtype} values in {file} (e.g. "
            f"{example!r}); a text column holds strings: declare it numeric or categorical "
            "in data.columns"
        )
    if role == "numeric" and found != "numeric" and not pa.types.is_boolean(dtype):
        example = first_value(file, column, fmt, endpoint_url, sheet)
        raise DataValidationError(
            f"column {column!r} is declared numeric but holds text in {file} (type {dtype}, e.g. "
            f"{example!r}); fix the values, or declare it categorical in data.columns"
        )
    if role == "datetime" and found == "numeric" and not pa.types.is_null(dtype):
        raise DataValidationError(
            f"column {column!r} is declared datetime but holds numbers ({dtype}) in {file}; "
            "declare it numeric or categorical in data.columns"
        )


def first_value(
    file: str, column: str, fmt: str, endpoint_url: str | None, sheet: str | int | None = None
) -> Any:
    """The first non-empty value of a column (for an error message), or None."""
    from training.data.formats import iter_batches
    from training.storage import filesystem

    fs, path = filesystem(file, endpoint_url)
    batches = iter_batches(fs, path, fmt, [column], sheet=sheet)
    for batch in batches:
        values = [v for v in batch.column(batch.schema.get_field_index(column)).to_pylist() if v]
        if values:
            return values[0]
    return None


def role_line(roles: dict[str, str]) -> str:
    """``5 numeric (a, b, c, d, e), 2 categorical (island, sex), 1 id-like ignored (order_id)``
    (the preprocess line): each role's count and its columns, the first ``NAMED_PER_ROLE`` of
    them named."""
    parts = []
    for role in (*FEATURE_ROLES, "id-like", "ignore", UNSUPPORTED):
        columns = [c for c, r in roles.items() if r == role]
        if columns:
            tag = "" if role in FEATURE_ROLES else " ignored"
            parts.append(f"{len(columns)} {role}{tag} ({named(columns)})")
    return ", ".join(parts)


def named(columns: list[str], most: int = NAMED_PER_ROLE) -> str:
    """``a, b, c`` or, for more than ``most`` columns, ``a, b, c, d, e, +59 more``."""
    more = f", +{len(columns) - most} more" if len(columns) > most else ""
    return ", ".join(columns[:most]) + more
