"""Naming the bad file when a Ray read fails: Ray's errors do not always say which file, or why.

A failure that is not the data's (a lost worker, the network) is left alone, so a retry can fix it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from training.data.formats import IMAGES, iter_batches
from training.data.image_files import read_images_here, with_decoded_paths
from training.data.schema import FIX_FILE, Plan, is_network, read_types
from training.errors import DataValidationError, one_line
from training.storage import filesystem


@contextlib.contextmanager
def naming_bad_files(files: list[str], plan: Plan, endpoint_url: str | None) -> Iterator[None]:
    """Re-raise a Ray read failure as a DataValidationError naming the file, where it is one."""
    try:
        yield
    except DataValidationError:
        raise
    except Exception as exc:
        clean = read_error(exc, files, plan, endpoint_url)
        if clean is None:
            raise
        raise clean from None


def read_error(
    exc: Exception, files: list[str], plan: Plan, endpoint_url: str | None
) -> DataValidationError | None:
    """Turn a Ray read failure into a DataValidationError naming the file, if it is the data's."""
    if is_network(exc):
        return None
    text = str(exc)
    named = sorted((f for f in files if f in text or f.removeprefix("s3://") in text), key=len)
    if named:
        candidates = named[-1:]
    elif isinstance(exc, (OSError, ValueError, pa.ArrowException)):
        candidates = files  # Ray's parquet errors do not always name the file: look for it
    else:
        return None  # not a read error (a lost worker, ...): let it be retried
    for file in candidates:
        reason = _diagnose(file, plan, endpoint_url)
        if reason is not None:
            return DataValidationError(f"cannot read {file} as {plan.fmt}: {reason}; {FIX_FILE}")
    if named:
        return DataValidationError(f"cannot read {named[-1]} as {plan.fmt}; {FIX_FILE}")
    return None


def _diagnose(file: str, plan: Plan, endpoint_url: str | None) -> str | None:
    """Read one file fully with pyarrow on the driver (row group by row group); the error text
    naming the row group where it is a parquet file, or None if it reads."""
    at = [""]
    try:
        for _ in _pieces(file, plan, endpoint_url, plan.columns, at):
            pass
    except (pa.ArrowException, OSError, ValueError) as exc:
        if is_network(exc):
            return None
        return f"{at[0]}: {one_line(exc)}" if at[0] else one_line(exc)
    return None


def _pieces(
    file: str, plan: Plan, endpoint_url: str | None, columns: list[str], at: list[str]
) -> Iterator[pa.Table | pa.RecordBatch]:
    """The rows of a file in order: parquet row groups, CSV and JSON blocks. ``at[0]`` names the
    piece being read (so an error, or a caller, can say where)."""
    import pyarrow.parquet as pq

    if plan.fmt == IMAGES:
        at[0] = ""
        yield from read_images_here([file], plan, endpoint_url)
        return
    fs, path = filesystem(file, endpoint_url)
    if plan.fmt == "parquet":
        parquet = pq.ParquetFile(path, filesystem=fs)
        groups = parquet.num_row_groups
        for index in range(groups):
            at[0] = f"row group {index} of {groups}"
            yield _decoded(parquet.read_row_group(index, columns=columns), plan, endpoint_url)
        return
    types = {c: t for c, t in read_types(plan).items() if c in columns}
    for batch in iter_batches(fs, path, plan.fmt, columns, types, plan.sheet):
        yield _decoded(batch, plan, endpoint_url)


def _decoded(piece, plan: Plan, endpoint_url: str | None):
    """An image column of paths with each file decoded, so a bad image is found (and named)."""
    return with_decoded_paths(piece, plan, endpoint_url) if plan.image_root else piece


def count_missing_labels(files: list[str], plan: Plan, endpoint_url: str | None) -> tuple[int, int]:
    """(rows without a label, rows) of the files, reading only the label column."""
    from training.data.rows import missing_labels

    missing = rows = 0
    for file in files:
        for piece in _pieces(file, plan, endpoint_url, [plan.label], [""]):
            missing += int(missing_labels(piece.column(0).to_pandas()).sum())
            rows += piece.num_rows
    return missing, rows


def locate_missing_labels(files: list[str], plan: Plan, endpoint_url: str | None) -> str | None:
    """The first file (with row group and row) holding a row without a label, or None.

    Reads only the label column, piece by piece: the error path of a big table stays cheap.
    """
    from training.data.rows import missing_labels

    for file in files:
        seen, at = 0, [""]
        for piece in _pieces(file, plan, endpoint_url, [plan.label], at):
            missing = np.flatnonzero(missing_labels(piece.column(0).to_pandas()))
            if len(missing):
                where = f"{at[0]}, " if at[0] else ""
                return f"{file} ({where}row {seen + int(missing[0])} of the file)"
            seen += piece.num_rows
    return None
