"""Opening an input file of any format trainflow reads: parquet; CSV and TSV; JSON lines, and a
JSON array of records; the text formats gzipped too; a sheet of an Excel workbook
(``workbooks``); and which suffixes are image files (a folder of them is read by
``image_files``).

One place knows how each format is opened, so every pass (the footer check, the summary, the
driver's small reads, a diagnosis, Ray Data's read) reads a file the same way: the same
columns, with the same fixed types where the plan fixed them (blocks and files whose inference
differs, int against float, still concatenate).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pyarrow as pa

from training.data.workbooks import XLSX, read_sheet
from training.errors import DataValidationError

#: The suffix of a gzipped text file. pyarrow's input streams and Ray Data's readers both
#: decompress by the suffix, so every pass reads the same rows from it.
GZIP = ".gz"
#: Text formats' suffixes -> format (``json``: lines, or one array, told by its first character).
_TEXT_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
}
#: A file's suffix -> its format.
SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    **_TEXT_SUFFIXES,
    **{suffix + GZIP: fmt for suffix, fmt in _TEXT_SUFFIXES.items()},
    ".xlsx": XLSX,
}
#: Sheet chosen by ``data.sheet``: a name, a 0-based index, or None for the first.
Sheet = str | int | None
#: The format of a folder of image files in class sub-folders, and its files' suffixes.
IMAGES = "images"
IMAGE_SUFFIXES = {".png": IMAGES, ".jpg": IMAGES, ".jpeg": IMAGES}
#: Rows per batch of a parquet file read here (CSV and JSON read in their own blocks).
BATCH_ROWS = 4096


def file_suffix(path: str) -> str:
    """A file's format suffix in lower case, a gzipped file's with the suffix before ``.gz``
    (``a.tsv.gz`` -> ``.tsv.gz``)."""
    stem, last = os.path.splitext(os.path.basename(path).lower())
    inner = os.path.splitext(stem)[1]
    return inner + last if last == GZIP and inner else last


def _csv_parse(path: str):
    """A TSV file's tab delimiter, else the CSV reader's comma."""
    import pyarrow.csv as pacsv

    return pacsv.ParseOptions(delimiter="\t" if file_suffix(path).startswith(".tsv") else ",")


def _csv_convert(columns: list[str] | None, types: dict[str, pa.DataType] | None):
    import pyarrow.csv as pacsv

    # strings_can_be_null: an empty label cell is a missing label, not a class named "".
    return pacsv.ConvertOptions(
        column_types=dict(types or {}), include_columns=columns, strings_can_be_null=True
    )


def _json_parse(types: dict[str, pa.DataType] | None):
    import pyarrow.json as pajson

    schema = pa.schema(list((types or {}).items()))
    return pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")


def _selected(table, columns: list[str] | None):
    """A JSON table or batch with only ``columns`` (Arrow's JSON reader reads every field); a
    column missing from it is left for the caller's column check to name."""
    if columns is None:
        return table
    return table.select([c for c in columns if c in table.schema.names])


def is_json_array(fs, path: str) -> bool:
    """Whether a JSON file holds one array (``[{...}, ...]``) rather than one object a line:
    its first character other than white space (and a byte-order mark) tells."""
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(256):
            start = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
            if start:
                return start[:1] == b"["
    return False


def _array_table(fs, path: str, types: dict[str, pa.DataType] | None) -> pa.Table:
    """A JSON array of records as a table. Arrow's JSON reader reads only JSON lines, so the
    whole array is parsed here and given to it as lines: the same types as the same records in
    a ``.jsonl`` file. The file, parsed, must fit in memory."""
    import pyarrow.json as pajson

    with fs.open_input_stream(path) as stream:
        try:
            records = json.load(stream)
        except ValueError as exc:
            raise DataValidationError(f"{path} is not valid JSON: {exc}; fix the file") from None
    if not all(isinstance(record, dict) for record in records):
        raise DataValidationError(
            f"{path} holds a JSON array whose items are not all objects; give one object per "
            'row ([{"column": value, ...}, ...])'
        )
    lines = [json.dumps(record).encode() for record in records]
    if not lines:
        return pa.schema(list((types or {}).items())).empty_table()
    # One object must fit in one block of Arrow's reader.
    block = max(1 << 20, max(len(line) for line in lines) + 1)
    return pajson.read_json(
        pa.BufferReader(b"\n".join(lines)),
        read_options=pajson.ReadOptions(block_size=block),
        parse_options=_json_parse(types),
    )


def iter_batches(
    fs,
    path: str,
    fmt: str,
    columns: list[str] | None = None,
    types: dict[str, pa.DataType] | None = None,
    sheet: Sheet = None,
) -> Iterator[pa.RecordBatch]:
    """A file's rows in order, batch by batch, read here with pyarrow (a workbook's sheet,
    ``sheet``, read whole first)."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if fmt == XLSX:
        yield from read_sheet(fs, path, sheet, columns, types).to_batches(BATCH_ROWS)
        return
    if fmt == "parquet":
        with fs.open_input_file(path) as handle:
            yield from pq.ParquetFile(handle).iter_batches(batch_size=BATCH_ROWS, columns=columns)
        return
    if fmt == "json" and is_json_array(fs, path):
        yield from _selected(_array_table(fs, path, types), columns).to_batches(BATCH_ROWS)
        return
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            for batch in pajson.open_json(stream, parse_options=_json_parse(types)):
                yield _selected(batch, columns)
            return
        convert = _csv_convert(columns, types)
        yield from pacsv.open_csv(stream, parse_options=_csv_parse(path), convert_options=convert)


def read_table(
    fs,
    path: str,
    fmt: str,
    columns: list[str] | None = None,
    types: dict[str, pa.DataType] | None = None,
    sheet: Sheet = None,
) -> pa.Table:
    """A whole file (a workbook's sheet ``sheet``) as one table, read here with pyarrow."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if fmt == XLSX:
        return read_sheet(fs, path, sheet, columns, types)
    if fmt == "parquet":
        return pq.read_table(path, filesystem=fs, columns=columns)
    if fmt == "json" and is_json_array(fs, path):
        return _selected(_array_table(fs, path, types), columns)
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            return _selected(pajson.read_json(stream, parse_options=_json_parse(types)), columns)
        convert = _csv_convert(columns, types)
        return pacsv.read_csv(stream, parse_options=_csv_parse(path), convert_options=convert)


def file_schema(fs, path: str, fmt: str, sheet: Sheet = None) -> tuple[pa.Schema, int | None]:
    """(schema, rows) from a parquet footer, a JSON array or a workbook's sheet (read whole),
    or (schema, None) from a CSV or JSON-lines first block."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if fmt == XLSX:
        table = read_sheet(fs, path, sheet)
        return table.schema, table.num_rows
    if fmt == "parquet":
        meta = pq.read_metadata(path, filesystem=fs)
        return meta.schema.to_arrow_schema(), meta.num_rows
    if fmt == "json" and is_json_array(fs, path):
        table = _array_table(fs, path, None)
        return table.schema, table.num_rows
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            return pajson.open_json(stream).schema, None
        return pacsv.open_csv(stream, parse_options=_csv_parse(path)).schema, None


def ray_read(
    paths: list[str],
    fs,
    fmt: str,
    columns: list[str] | None,
    types: dict | None,
    sheet: Sheet = None,
):
    """A CSV, JSON or workbook input as a lazy Ray Dataset of ``columns`` (parquet has its
    own): one Ray Data read per kind of file (CSV, TSV, JSON lines), JSON arrays and
    workbooks' sheets read here (whole, in memory) and put in the object store."""
    if fmt == XLSX:
        import ray.data

        local = fs or _local_fs()
        return ray.data.from_arrow([read_sheet(local, p, sheet, columns, types) for p in paths])
    groups: dict[str, list[str]] = {}
    for path in paths:
        groups.setdefault(_ray_kind(fs, path, fmt), []).append(path)
    parts = [_ray_part(kind, files, fs, columns, types) for kind, files in groups.items()]
    dataset = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    if fmt == "json" and columns is not None:
        dataset = dataset.select_columns(columns)
    return dataset


def _ray_kind(fs, path: str, fmt: str) -> str:
    """How Ray Data reads a file: ``csv``, ``tsv``, ``json`` (lines) or ``json-array``."""
    if fmt == "csv":
        return "tsv" if file_suffix(path).startswith(".tsv") else "csv"
    local = fs or _local_fs()
    return "json-array" if is_json_array(local, path) else "json"


def _local_fs():
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


def _ray_part(kind: str, paths: list[str], fs, columns: list[str] | None, types: dict | None):
    """One kind of file as a Ray Dataset. Ray Data decompresses a ``.gz`` file by its suffix."""
    import ray.data

    if kind == "json-array":
        local = fs or _local_fs()
        return ray.data.from_arrow([_array_table(local, path, types) for path in paths])
    common = {"filesystem": fs, "file_extensions": None, "partitioning": None}
    if kind == "json":
        # Arrow's reader (lines=False) reads one object per line and takes a schema; Ray's
        # lines=True reader goes through pandas and would infer types block by block.
        return ray.data.read_json(paths, lines=False, parse_options=_json_parse(types), **common)
    convert = _csv_convert(columns, types)
    parse = _csv_parse(paths[0])
    return ray.data.read_csv(paths, convert_options=convert, parse_options=parse, **common)
