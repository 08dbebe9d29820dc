"""A text model's processed rows: token ids stored as a variable-length ``list<int32>`` column
(no padding on disk), padded to the batch's longest row (or a fixed width) when read."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from training.model.trainflow_pyfunc.tokens import pad_flat


def is_token_lists(column: pa.Array | pa.ChunkedArray) -> bool:
    """True for a column of variable-length lists (a text model's token ids)."""
    return pa.types.is_list(column.type) or pa.types.is_large_list(column.type)


def token_lists(rows: np.ndarray) -> pa.Array:
    """Rows of token ids (an object array of int32 arrays) -> a ``list<int32>`` column."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
    values = np.concatenate(list(rows)).astype(np.int32) if len(rows) else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def padded_lists(column: pa.Array | pa.ChunkedArray, width: int | None = None) -> np.ndarray:
    """A ``list<int32>`` column -> float32 [rows, width] padded with ``tokens.PAD`` (float32: the
    dtype every trainflow batch shares; ids are exact below 2**24). ``width`` None: the longest
    row's length."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = column.offsets.to_numpy()
    values = column.flatten().to_numpy(zero_copy_only=False)
    return pad_flat(values, np.diff(offsets), width).astype(np.float32)
