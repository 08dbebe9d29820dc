"""Sequence packing for a language model (``data.task: causal_lm``, ``data.pack: true``): the
token ids of a split's consecutive texts concatenated and cut into blocks of ``max_length``,
each block one row (its label column 0: the loss's targets are the ids, shifted), so no
position is padding and no text is truncated.

Packing runs per Ray Data batch (``BATCH_ROWS`` texts) and per split: blocks never cross a
batch boundary (a batch is one task, and rows of two splits must never share a block). A
batch's last, shorter block is kept as it is (padded with the other rows of its training batch
when read): nothing is dropped, and there is at most one short block per split per batch.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from training.data.rows import SPLIT
from training.manifest import FEATURES, LABEL, SAMPLE_ID
from training.storage import filesystem

#: A block needs two tokens to have one next-token target.
MIN_BLOCK = 2


def block_bounds(total: int, block: int) -> np.ndarray:
    """Start offsets of the blocks of ``total`` concatenated tokens (the last may be shorter,
    dropped below MIN_BLOCK tokens)."""
    starts = np.arange(0, total, block, dtype=np.int64)
    if len(starts) and total - starts[-1] < MIN_BLOCK:
        starts = starts[:-1]
    return starts


def _pack_split(rows: pa.Table, block: int) -> pa.Table:
    ids = rows.column(FEATURES).combine_chunks()
    values = ids.flatten().to_numpy(zero_copy_only=False).astype(np.int32)
    offsets = ids.offsets.to_numpy().astype(np.int64)
    starts = block_bounds(len(values), block)
    ends = np.minimum(starts + block, len(values))
    if len(starts) and ends[-1] < len(values):  # a dropped 1-token tail
        values = values[: ends[-1]]
    lists = pa.ListArray.from_arrays(
        pa.array(np.append(starts, ends[-1] if len(ends) else 0).astype(np.int32)),
        pa.array(values),
    )
    # A block's identity: the row it starts in, moved by where in that row it starts.
    first_row = np.searchsorted(offsets, starts, side="right") - 1
    sample_ids = rows.column(SAMPLE_ID).to_numpy()[first_row] + (starts - offsets[first_row])
    return pa.table(
        {
            FEATURES: lists,
            LABEL: np.zeros(len(starts), dtype=np.int64),  # the targets are the ids themselves
            SAMPLE_ID: sample_ids.astype(np.int64),
            SPLIT: pa.array([rows.column(SPLIT)[0].as_py()] * len(starts), pa.string()),
        }
    )


def pack_blocks(table: pa.Table, block: int) -> pa.Table:
    """Rows of token ids (one text each) -> rows of ``block`` tokens, split by split."""
    splits = table.column(SPLIT).to_pylist()
    parts = []
    for name in dict.fromkeys(splits):
        mask = pa.array([s == name for s in splits])
        parts.append(_pack_split(table.filter(mask), block))
    if not parts:
        return table
    return pa.concat_tables(parts)


def written_rows(split_uris: dict[str, str], endpoint_url: str | None) -> dict[str, int]:
    """Rows per split as written (packing changes them): from the parquet files' footers."""
    import pyarrow.dataset as pads

    rows = {}
    for split, uri in split_uris.items():
        fs, path = filesystem(uri, endpoint_url)
        rows[split] = pads.dataset(path, filesystem=fs, format="parquet").count_rows()
    return rows
