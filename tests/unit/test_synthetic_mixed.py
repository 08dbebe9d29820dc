"""``make-data --kind mixed``: seeded, the same however it is written, every kind of column, and
a label that depends on the categories."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from training.datasets.synthetic_mixed import mixed_chunk, write_mixed


def test_the_mixed_table_has_every_kind_of_column_and_gaps():
    table = mixed_chunk(5_000, seed=3, index=0)
    assert pa.types.is_timestamp(table.schema.field("signup").type)
    assert pa.types.is_string(table.schema.field("plan").type)
    frame = table.to_pandas()
    assert frame["amount"].isna().mean() > 0.02 and frame["plan"].isna().any()
    assert frame["customer_id"].is_unique
    assert 50 < frame["region"].nunique() <= 500 and frame["plan"].nunique() == 5
    # The label depends on the plan: its class mix differs by plan.
    mix = frame.groupby("plan")["label"].agg(lambda s: s.value_counts(normalize=True).max())
    assert mix.max() - mix.min() > 0.1


def test_the_same_seed_writes_the_same_rows_in_any_number_of_files(tmp_path):
    one = write_mixed(tmp_path / "one.parquet", 2_500, seed=1, num_files=1)
    many = write_mixed(tmp_path / "many", 2_500, seed=1, num_files=3)
    first = pq.read_table(one[0])
    second = pa.concat_tables([pq.read_table(f) for f in many])
    assert first.equals(second)
    assert not first.equals(mixed_chunk(2_500, seed=2, index=0))
