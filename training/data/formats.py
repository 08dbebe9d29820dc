"""Opening an input file of any format trainflow reads: parquet, CSV and JSON lines (and which
suffixes are image files: a folder of them is read by ``image_files``).

One place knows how each format is opened, so every pass (the footer check, the summary, the
driver's small reads, a diagnosis, Ray Data's read) reads a file the same way: the same
columns, with the same fixed types where the plan fixed them (blocks and files whose inference
differs, int against float, still concatenate).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

#: A file's suffix -> its format.
SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
}
#: The format of a folder of image files in class sub-folders, and its files' suffixes.
IMAGES = "images"
IMAGE_SUFFIXES = {".png": IMAGES, ".jpg": IMAGES, ".jpeg": IMAGES}
#: Rows per batch of a parquet file read here (CSV and JSON read in their own blocks).
BATCH_ROWS = 4096


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


def iter_batches(
    fs,
    path: str,
    fmt: str,
    columns: list[str] | None = None,
    types: dict[str, pa.DataType] | None = None,
) -> Iterator[pa.RecordBatch]:
    """A file's rows in order, batch by batch, read here with pyarrow."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if fmt == "parquet":
        with fs.open_input_file(path) as handle:
            yield from pq.ParquetFile(handle).iter_batches(batch_size=BATCH_ROWS, columns=columns)
        return
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            for batch in pajson.open_json(stream, parse_options=_json_parse(types)):
                yield _selected(batch, columns)
            return
        yield from pacsv.open_csv(stream, convert_options=_csv_convert(columns, types))


def read_table(
    fs,
    path: str,
    fmt: str,
    columns: list[str] | None = None,
    types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """A whole file as one table, read here with pyarrow."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if fmt == "parquet":
        return pq.read_table(path, filesystem=fs, columns=columns)
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            return _selected(pajson.read_json(stream, parse_options=_json_parse(types)), columns)
        return pacsv.read_csv(stream, convert_options=_csv_convert(columns, types))


def file_schema(fs, path: str, fmt: str) -> tuple[pa.Schema, int | None]:
    """(schema, rows) from a parquet footer, or (schema, None) from a CSV or JSON first block."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    if fmt == "parquet":
        meta = pq.read_metadata(path, filesystem=fs)
        return meta.schema.to_arrow_schema(), meta.num_rows
    with fs.open_input_stream(path) as stream:
        if fmt == "json":
            return pajson.open_json(stream).schema, None
        return pacsv.open_csv(stream).schema, None


def ray_read_args(fmt: str, columns: list[str] | None, types: dict[str, pa.DataType] | None):
    """(Ray Data's reader name, its keyword arguments) for a CSV or JSON-lines read."""
    if fmt == "json":
        # Arrow's reader (lines=False) reads one object per line and takes a schema; Ray's
        # lines=True reader goes through pandas and would infer types block by block.
        return "read_json", {"lines": False, "parse_options": _json_parse(types)}
    return "read_csv", {"convert_options": _csv_convert(columns, types)}


def ray_read(paths: list[str], fs, fmt: str, columns: list[str] | None, types: dict | None):
    """A CSV or JSON-lines input as a lazy Ray Dataset of ``columns`` (parquet has its own)."""
    import ray.data

    reader, kwargs = ray_read_args(fmt, columns, types)
    dataset = getattr(ray.data, reader)(
        paths, filesystem=fs, file_extensions=None, partitioning=None, **kwargs
    )
    if fmt == "json" and columns is not None:
        dataset = dataset.select_columns(columns)
    return dataset
