"""Naming the bad file when a Ray read fails: Ray's errors do not always say which file, or why.

A failure that is not the data's (a lost worker, the network) is left alone, so a retry can fix it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa

from training.data.schema import FIX_FILE, Plan, csv_options, is_network
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
    """Read one file fully with pyarrow on the driver; the error text, or None if it reads."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    fs, path = filesystem(file, endpoint_url)
    try:
        if plan.fmt == "parquet":
            for _ in pq.ParquetFile(path, filesystem=fs).iter_batches(columns=plan.columns):
                pass
        else:
            with fs.open_input_stream(path) as stream:
                for _ in pacsv.open_csv(stream, **csv_options(plan)):
                    pass
    except (pa.ArrowException, OSError, ValueError) as exc:
        return None if is_network(exc) else one_line(exc)
    return None
