"""The loop's Ray Data batches: Arrow -> tensors without object arrays, chunk-wise shuffle."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from training.loop.collate import CHUNK_BATCHES, SplitCollate, chunk_rows, rebatch
from training.manifest import FEATURES, LABEL, SAMPLE_ID

WIDTH = 5


def _split_table(rows: int, first: int = 0) -> pa.Table:
    """A processed split's columns: fixed-size list features, int64 label and sample id."""
    values = np.arange(first * WIDTH, (first + rows) * WIDTH, dtype=np.float32)
    return pa.table(
        {
            FEATURES: pa.FixedSizeListArray.from_arrays(pa.array(values), WIDTH),
            LABEL: pa.array(np.arange(first, first + rows) % 3, pa.int64()),
            SAMPLE_ID: pa.array(np.arange(first, first + rows), pa.int64()),
        }
    )


def test_collate_turns_a_chunked_arrow_batch_into_whole_tensors():
    # Ray Data's batches are often several chunks (one per block they came from).
    table = pa.concat_tables([_split_table(4), _split_table(3, first=4)])
    assert table.column(FEATURES).num_chunks == 2
    batch = SplitCollate(torch.float32)(table)
    assert batch[FEATURES].dtype == torch.float32
    assert batch[FEATURES].shape == (7, WIDTH)
    assert torch.equal(batch[FEATURES].flatten(), torch.arange(7 * WIDTH, dtype=torch.float32))
    assert batch[LABEL].dtype == torch.float32  # a regression's label dtype
    assert batch[LABEL].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert batch[SAMPLE_ID].tolist() == list(range(7))


def _chunks(rows: int, chunk: int):
    collate = SplitCollate()
    table = _split_table(rows)
    return (collate(table.slice(first, chunk)) for first in range(0, rows, chunk))


def test_rebatch_in_order_without_a_seed_and_hands_out_copies():
    chunks = list(_chunks(10, 8))
    batches = list(rebatch(iter(chunks), 3, seed=None))
    assert [b[SAMPLE_ID].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    batches[0][FEATURES].zero_()  # a model writing into its input
    assert chunks[0][FEATURES][0, 1] == 1  # leaves the chunk (Arrow's read-only buffer) alone


def test_rebatch_shuffles_within_chunks_reproducibly():
    def order(seed):
        return [b[SAMPLE_ID].tolist() for b in rebatch(_chunks(40, 16), 4, seed=seed)]

    first = order(7)
    assert first == order(7)  # same seed, same batches: a resumed epoch replays them
    assert first != order(8)
    flat = [i for batch in first for i in batch]
    assert sorted(flat) == list(range(40))  # every row once
    assert flat != list(range(40))
    # Rows stay within their chunk of 16: a bounded window, like a local shuffle buffer.
    assert sorted(flat[:16]) == list(range(16))
    assert [len(b) for b in first] == [4] * 10


def test_rebatch_keeps_features_and_labels_of_a_row_together():
    for batch in rebatch(_chunks(30, 12), 5, seed=1):
        ids = batch[SAMPLE_ID]
        assert torch.equal(batch[LABEL], ids % 3)
        assert torch.equal(batch[FEATURES][:, 0], (ids * WIDTH).to(torch.float32))


@pytest.mark.parametrize(
    ("batch", "row_bytes", "expected"),
    [
        (512, 272, 512 * CHUNK_BATCHES),  # the default table: 16 batches
        (512, 4 * 3 * 32 * 32 + 16, 512 * 10),  # images: capped by bytes
        (8192, 4 * 3 * 224 * 224, 8192),  # never less than one batch
        (64, 0, 64 * CHUNK_BATCHES),  # row size unknown
    ],
)
def test_chunks_are_whole_batches_bounded_in_bytes(batch, row_bytes, expected):
    assert chunk_rows(batch, row_bytes) == expected
