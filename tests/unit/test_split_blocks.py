"""A small split put in the object store in blocks of a bounded size (training.data.read)."""

from __future__ import annotations

import pyarrow as pa

from training.data.read import _blocks


def test_blocks_are_consecutive_slices_of_at_most_the_size():
    table = pa.table({"x": pa.array(range(10_000), pa.int64())})  # 80,000 bytes
    blocks = _blocks(table, 8_000)
    assert all(b.nbytes <= 8_000 for b in blocks)
    assert len(blocks) == 10
    assert pa.concat_tables(blocks).equals(table)


def test_a_table_smaller_than_a_block_is_one_block_and_an_empty_one_too():
    table = pa.table({"x": pa.array(range(10), pa.int64())})
    assert _blocks(table, 1024**2) == [table]
    empty = table.slice(0, 0)
    [only] = _blocks(empty, 1024)
    assert only.num_rows == 0
