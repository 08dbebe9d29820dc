"""The driver's look at the input before any heavy pass: every file's parquet footer or CSV
header must hold the label and feature (or image) columns, with numbers in them.

The result is the ``Plan`` every later pass reads by: format and columns.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

import pyarrow as pa

from training.config import DataConfig
from training.data.columns import check_image_shape, require_columns
from training.data.formats import IMAGES, SUFFIXES, file_schema, file_suffix
from training.data.roles import table_roles
from training.errors import DataValidationError, ServiceUnreachableError
from training.storage import filesystem, is_remote

log = logging.getLogger(__name__)

#: How a message about one bad input file ends.
FIX_FILE = "re-export it or remove it from the input directory"


@dataclass(frozen=True)
class Plan:
    """What the passes read: the format, the label, and the feature columns or image column.

    ``features`` are the numeric columns; ``roles`` every table column read, by its role from
    its type (numeric, categorical, datetime; the summary pass may still find a string column
    id-like or free text); ``ignored`` the columns not read, with the reason.
    """

    fmt: str
    label: str
    features: list[str] | None
    image: str | None
    roles: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    #: [C, H, W] every image file is decoded and resized to (an image folder, or paths).
    image_shape: list[int] | None = None
    #: Where the image column holds file paths: the directory relative ones start from.
    image_root: str | None = None
    #: The formats each column that may hold dates as text is tried under (the summary pass).
    date_formats: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: A workbook's sheet (``data.sheet``: a name, a 0-based index; None: the first).
    sheet: str | int | None = None

    @property
    def hash_roles(self) -> dict[str, str]:
        """The columns a row's identity hashes, by role (the numeric ones alone: as before)."""
        return self.roles or {c: "numeric" for c in self.features or []}

    @property
    def columns(self) -> list[str]:
        if self.image:
            return [self.image, self.label]
        return [*(self.hash_roles or {}), self.label]


def is_numeric(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_decimal(dtype)
    )


def read_types(plan: Plan) -> dict[str, pa.DataType]:
    """The fixed Arrow type of each feature column a CSV or JSON read yields: blocks (and files)
    whose inference differs (int against float) still concatenate."""
    types = {
        "numeric": pa.float64(),
        "categorical": pa.string(),
        "datetime": pa.string(),
        "text": pa.string(),
    }
    return {c: types[r] for c, r in plan.hash_roles.items() if r in types}


def _file_schema(
    file: str, fmt: str, endpoint_url: str | None, sheet: str | int | None = None
) -> tuple[pa.Schema, int | None]:
    """(schema, rows) from a parquet footer, or (schema, None) from a CSV's first block."""
    fs, path = filesystem(file, endpoint_url)
    try:
        return file_schema(fs, path, fmt, sheet)
    except (pa.ArrowInvalid, OSError) as exc:
        if is_network(exc):
            raise ServiceUnreachableError(
                f"cannot read {file}: {exc}; check the network and storage.endpoint_url"
            ) from None
        raise DataValidationError(
            f"input file {file} is not a readable {fmt} file ({exc}); {FIX_FILE}"
        ) from None


def is_network(exc: BaseException) -> bool:
    # pyarrow reports S3 trouble as OSError, like a corrupt file: a retry may fix only these.
    text = str(exc)
    return isinstance(exc, (ConnectionError, TimeoutError)) or any(
        hint in text for hint in ("AWS Error", "curl", "Connection refused", "timed out")
    )


def check_schema(data: DataConfig, files: list[str], fmt: str, endpoint_url: str | None) -> Plan:
    """Check every file's columns from its footer or header; the plan the passes read by."""
    if fmt == IMAGES:
        return _image_folder_plan(data)
    features = list(data.feature_columns) if data.feature_columns else None
    which = "data.feature_columns" if data.feature_columns else "the first file's columns"
    width = None
    paths = False  # an image column of file paths
    total_rows: int | None = 0
    first_label: tuple[str, pa.DataType] | None = None
    roles: dict[str, str] = {}
    first_file = ""  # the file whose schema gave the roles
    ignored: dict[str, str] = {}
    for file in files:
        schema, rows = _file_schema(file, fmt, endpoint_url, data.sheet)
        total_rows = None if rows is None or total_rows is None else total_rows + rows
        require_columns(file, schema.names, label=data.label_column)
        _require_prompt_response(file, schema.names, data)
        first_label = _same_label_kind(file, schema.field(data.label_column).type, first_label)
        if data.image_column is not None:
            paths = _holds_paths(file, schema, data.image_column, paths)
            width = None if paths else _check_image_column(file, schema, data.image_column)
            continue
        fix = f"Fix data.feature_columns or {FIX_FILE}"
        wanted = list(roles) or features or []
        require_columns(file, schema.names, features=wanted, origin=f" (from {which})", fix=fix)
        if not roles:
            roles, ignored = table_roles(file, schema, data, fmt, endpoint_url, features)
            features = [c for c, r in roles.items() if r == "numeric"]
            first_file = file
        _numbers_everywhere(file, schema, features, first_file)
        width = len(features)
    if total_rows == 0:
        raise DataValidationError(
            f"the input has no rows (all {len(files)} file(s) are empty: {files[:3]}); point "
            "data.source at data with rows"
        )
    if width is not None:
        check_image_shape(data.image_shape, width)
    if paths:
        return _image_paths_plan(data, fmt)
    dates = date_candidates(roles, data)
    return Plan(
        fmt,
        data.label_column,
        features,
        data.image_column,
        roles,
        ignored,
        date_formats=dates,
        sheet=data.sheet,
    )


def date_candidates(roles: dict[str, str], data: DataConfig) -> dict[str, tuple[str, ...]]:
    """The formats each string or datetime column is tried under: a column declared anything but
    datetime is what it says, so it is not tried."""
    from training.data.dates import candidate_formats

    out = {}
    for column, role in roles.items():
        declared = data.columns.get(column)
        if role == "datetime" or (role == "categorical" and declared is None):
            wanted = data.date_formats.get(column)
            out[column] = candidate_formats(wanted, declared == "datetime")
    return out


def _require_prompt_response(file: str, names: list[str], data: DataConfig) -> None:
    """A language model's prompt and response columns, where set, are in every file."""
    keys = {"data.prompt_column": data.prompt_column, "data.response_column": data.response_column}
    missing = {key: column for key, column in keys.items() if column and column not in names}
    if missing:
        named = ", ".join(f"{column!r} ({key})" for key, column in missing.items())
        raise DataValidationError(
            f"{file} has no column {named}; its columns are {list(names)[:20]}. Set "
            "data.prompt_column and data.response_column to two of them"
        )


def _image_folder_plan(data: DataConfig) -> Plan:
    """An image folder's rows: its image column (``data.image_column``, default ``image``) of
    pixels resized to ``data.image_shape``, and the class folder's name as the label."""
    from training.model.trainflow_pyfunc.images import mode_of

    if data.image_shape is None:
        raise DataValidationError(
            f"{data.source!r} reads image files: set data.image_shape to the [C, H, W] every "
            "image is resized to, e.g. [1, 28, 28] (grey) or [3, 32, 32] (RGB)"
        )
    try:
        mode_of(data.image_shape)
    except ValueError as exc:
        raise DataValidationError(f"data.image_shape: {exc}") from None
    image = data.image_column or "image"
    return Plan(IMAGES, data.label_column, None, image, image_shape=list(data.image_shape))


def _holds_paths(file: str, schema: pa.Schema, column: str, so_far: bool) -> bool:
    """Whether an image column holds file paths (text) rather than arrays, alike in every file."""
    require_columns(file, schema.names, image=column)
    dtype = schema.field(column).type
    text = pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
    if so_far and not text and not pa.types.is_null(dtype):
        raise DataValidationError(
            f"image column {column!r} holds file paths in the first file but {dtype} in {file}; "
            f"{FIX_FILE}"
        )
    return so_far or text


def image_root(source: str, is_file: bool) -> str:
    """The directory a table's relative image paths start from: the table's own."""
    if not is_file:
        return source
    return source.rsplit("/", 1)[0] if is_remote(source) else os.path.dirname(source)


def _image_paths_plan(data: DataConfig, fmt: str) -> Plan:
    """A table whose image column names image files: decoded and resized to data.image_shape."""
    folder = _image_folder_plan(data)
    is_file = file_suffix(data.source) in SUFFIXES
    root = image_root(data.source, is_file)
    shape = folder.image_shape
    return Plan(fmt, data.label_column, None, folder.image, image_shape=shape, image_root=root)


def _numbers_everywhere(file: str, schema: pa.Schema, numeric: list[str], first_file: str) -> None:
    """A column that is numeric in the first file is numeric in every file: a text copy of it
    in one file would otherwise fail deep inside Ray Data with no file named."""
    bad = {
        c: str(schema.field(c).type)
        for c in numeric
        if not is_numeric(schema.field(c).type) and not pa.types.is_null(schema.field(c).type)
    }
    if bad:
        raise DataValidationError(
            f"column(s) {sorted(bad)[:10]} hold numbers in {first_file} but {bad} in {file}; "
            f"{FIX_FILE}"
        )


def _same_label_kind(
    file: str, dtype: pa.DataType, first: tuple[str, pa.DataType] | None
) -> tuple[str, pa.DataType] | None:
    """Labels are numbers in every file or text in every file: 3 and "3" would be two classes."""
    if pa.types.is_null(dtype):  # a CSV block of empty cells says nothing yet
        return first
    if first is None:
        return file, dtype
    first_file, first_type = first
    if is_numeric(dtype) != is_numeric(first_type):
        raise DataValidationError(
            f"label column has type {dtype} in {file} but {first_type} in {first_file}: the same "
            f"class would be two; {FIX_FILE}"
        )
    return first


def _check_image_column(file: str, schema: pa.Schema, column: str) -> int | None:
    """The width of an image column of fixed-size numeric arrays (None: not known yet)."""
    require_columns(file, schema.names, image=column)
    dtype = schema.field(column).type
    shape = getattr(dtype, "shape", None)  # Ray's tensor extension types
    if shape is not None and all(isinstance(d, int) and d > 0 for d in shape):
        return math.prod(shape)
    storage = dtype.storage_type if isinstance(dtype, pa.ExtensionType) else dtype
    is_list = pa.types.is_list(storage) or pa.types.is_large_list(storage)
    if (is_list or pa.types.is_fixed_size_list(storage)) and is_numeric(storage.value_type):
        return storage.list_size if pa.types.is_fixed_size_list(storage) else None
    raise DataValidationError(
        f"image column {column!r} in {file} has type {dtype}; data.image_column needs a column of "
        "fixed-size numeric arrays (e.g. list<float>)"
    )
