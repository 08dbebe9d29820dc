"""The real-size generators: seeded, independent of the file layout, learnable, and
written chunk by chunk; ``trainflow make-data`` writes them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from training.datasets.synthetic import (
    CHUNK_ROWS,
    color_images,
    synthetic_table,
    write_color_images,
    write_table,
)


def test_table_is_seeded_and_shaped():
    table = synthetic_table(500, seed=3)
    assert table.num_rows == 500
    assert table.column_names == [*(f"f{i:02d}" for i in range(64)), "label"]
    assert table.schema.field("f00").type == pa.float32()
    assert table.schema.field("label").type == pa.int64()
    assert table.equals(synthetic_table(500, seed=3))
    assert not table.equals(synthetic_table(500, seed=4))


def test_table_does_not_depend_on_the_number_of_files(tmp_path):
    rows = CHUNK_ROWS + 777  # more than one chunk, cut unevenly by the files
    files = write_table(tmp_path / "t", rows, seed=1, num_files=7)
    assert len(files) == 7
    written = pa.concat_tables(pq.read_table(f) for f in files)
    assert written.equals(synthetic_table(rows, seed=1))
    assert not list(tmp_path.rglob(".*tmp*"))  # nothing left half-written


def test_table_label_is_learnable():
    # A least-squares linear readout on half the rows predicts the other half far above chance.
    table = synthetic_table(6000, seed=0)
    x = np.stack([table.column(i).to_numpy() for i in range(64)], axis=1)
    y = table.column("label").to_numpy()
    assert len(np.unique(y)) == 10
    onehot = np.eye(10)[y]
    w, *_ = np.linalg.lstsq(x[:3000], onehot[:3000], rcond=None)
    accuracy = (np.argmax(x[3000:] @ w, axis=1) == y[3000:]).mean()
    assert accuracy > 0.5, accuracy  # chance is ~0.1


def test_color_images_are_uint8_chw_with_labels(tmp_path):
    table = color_images(64, seed=2)
    image_type = table.schema.field("image").type
    assert pa.types.is_fixed_size_list(image_type) and image_type.list_size == 3 * 32 * 32
    assert image_type.value_type == pa.uint8()
    assert set(table.column("label").to_numpy()) <= set(range(10))
    files = write_color_images(tmp_path / "img", 64, seed=2, num_files=3)
    assert pa.concat_tables(pq.read_table(f) for f in files).equals(table)


def test_make_data_cli_writes_files_and_names_errors(tmp_path):
    from trainflow.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["make-data", str(tmp_path / "d"), "-n", "1000", "-f", "4"])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "d").glob("part-*.parquet"))) == 4
    assert "data.source=" in result.output
    bad = runner.invoke(app, ["make-data", str(tmp_path / "e"), "--kind", "bogus"])
    assert bad.exit_code == 2
    assert "bogus" in bad.output


def test_no_rows_is_refused(tmp_path):
    with pytest.raises(ValueError):
        write_table(tmp_path / "z", 0, seed=0)
