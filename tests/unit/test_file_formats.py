"""Every file form trainflow reads, read here with pyarrow (the footer check, the summary, the
driver's small reads): a small table written as CSV, TSV, JSON lines, a JSON array, and each
of them gzipped, comes back as the same rows with the same types."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pytest

from training.config import DataConfig
from training.data.formats import (
    SUFFIXES,
    file_schema,
    file_suffix,
    is_json_array,
    iter_batches,
    read_table,
)
from training.data.inputs import input_format, resolve_inputs
from training.errors import DataValidationError
from training.stages.score import predictions_location

FS = pafs.LocalFileSystem()
ROWS = [
    {"x": 1, "w": 0.5, "kind": "a b", "label": "cat"},
    {"x": 2, "w": None, "kind": "c", "label": "dog"},
    {"x": 3, "w": 2.25, "kind": None, "label": "cat"},
]
TYPES = {"x": pa.int64(), "w": pa.float64(), "kind": pa.string(), "label": pa.string()}


def _text(suffix: str) -> bytes:
    """ROWS written the way an export writes ``suffix`` (before any .gz)."""
    if suffix in (".csv", ".tsv"):
        sink = pa.BufferOutputStream()
        options = pacsv.WriteOptions(delimiter="\t" if suffix == ".tsv" else ",")
        pacsv.write_csv(pa.Table.from_pylist(ROWS), sink, write_options=options)
        return sink.getvalue().to_pybytes()
    if suffix == ".json":  # an array, pretty-printed as exports do
        return json.dumps(ROWS, indent=2).encode()
    return "\n".join(json.dumps(row) for row in ROWS).encode()


def _write(tmp_path, suffix: str) -> str:
    base = suffix.removesuffix(".gz")
    data = _text(base)
    path = tmp_path / f"table{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    return str(path)


FORMS = [".csv", ".tsv", ".jsonl", ".json", ".csv.gz", ".tsv.gz", ".jsonl.gz", ".json.gz"]


@pytest.mark.parametrize("suffix", FORMS)
def test_each_form_reads_back_the_same_rows_and_types(tmp_path, suffix):
    path = _write(tmp_path, suffix)
    fmt = input_format(DataConfig(source=path), [path])
    assert fmt == ("csv" if ".csv" in suffix or ".tsv" in suffix else "json")
    table = read_table(FS, path, fmt)
    assert table.select(list(TYPES)).to_pylist() == ROWS
    assert {name: table.schema.field(name).type for name in TYPES} == TYPES
    batches = pa.Table.from_batches(list(iter_batches(FS, path, fmt, ["label", "x"])))
    assert batches.to_pylist() == [{"label": r["label"], "x": r["x"]} for r in ROWS]
    schema, _ = file_schema(FS, path, fmt)
    assert set(schema.names) == set(TYPES)


def test_a_planned_type_is_kept_in_a_json_array(tmp_path):
    path = _write(tmp_path, ".json")
    table = read_table(FS, path, "json", ["x", "label"], {"x": pa.float64()})
    assert table.schema.field("x").type == pa.float64()
    assert table.column("x").to_pylist() == [1.0, 2.0, 3.0]


def test_a_json_file_is_an_array_or_lines_by_its_first_character(tmp_path):
    array, lines = tmp_path / "a.json", tmp_path / "l.json"
    array.write_text('\ufeff\n  [{"x": 1}, {"x": 2}]')
    lines.write_text('\n{"x": 1}\n{"x": 2}\n')
    assert is_json_array(FS, str(array)) and not is_json_array(FS, str(lines))
    for path in (array, lines):
        assert read_table(FS, str(path), "json").to_pylist() == [{"x": 1}, {"x": 2}]


def test_an_array_of_non_objects_is_refused_with_the_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("[1, 2]")
    with pytest.raises(DataValidationError, match="not all objects") as err:
        read_table(FS, str(path), "json")
    assert str(path) in str(err.value)


def test_the_format_suffix_sees_through_gzip():
    assert file_suffix("s3://b/k/Table.TSV.gz") == ".tsv.gz"
    assert file_suffix("/d/x.gz") == ".gz"
    assert file_suffix("/d/x.csv") == ".csv"


def test_an_unknown_suffix_names_only_suffixes_that_are_read(tmp_path):
    path = tmp_path / "table.xml"
    path.write_bytes(b"<rows/>")
    with pytest.raises(DataValidationError) as err:
        resolve_inputs(DataConfig(source=str(path)))
    message = str(err.value)
    named = {word.strip(",") for word in message.split() if word.startswith(".")}
    assert named == set(SUFFIXES)
    assert {".json", ".tsv", ".csv.gz", ".json.gz", ".xlsx"} <= named
    assert "data.format" in message


def test_a_folder_lists_gzipped_and_tab_separated_files(tmp_path):
    for suffix in (".tsv.gz", ".tsv"):
        _write(tmp_path, suffix)
    (tmp_path / "notes.gz").write_bytes(gzip.compress(b"x"))
    files = resolve_inputs(DataConfig(source=str(tmp_path)))
    assert [f.rsplit("/", 1)[1] for f in files] == ["table.tsv", "table.tsv.gz"]


def test_predictions_of_a_gzipped_file_go_beside_it():
    assert predictions_location("/d/new.csv.gz", "3") == "/d/new.scored-v3.parquet"
    assert predictions_location("/d/new.json", "3") == "/d/new.scored-v3.parquet"
