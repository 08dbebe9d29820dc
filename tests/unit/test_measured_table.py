"""The "Measured" tables of README.md and docs/benchmarks.md are what benchmarks/results/ says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import doc_tables as dt
from benchmarks import measured_table as mt

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("doc", ["README.md", "docs/benchmarks.md"])
def test_the_committed_table_is_the_generated_one(doc):
    text = (REPO_ROOT / doc).read_text()
    assert mt.block_in(text) == mt.render(), (
        f"{doc}'s Measured table differs from benchmarks/results/*.json: "
        "run `python -m benchmarks.measured_table --write`"
    )


@pytest.fixture
def results(tmp_path) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(
        REPO_ROOT / "benchmarks" / "results", copy, ignore=shutil.ignore_patterns("smoke")
    )
    return copy


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_changed_result_changes_the_table(results):
    readme_block = mt.block_in((REPO_ROOT / "README.md").read_text())
    assert mt.render(results) == readme_block

    _edit(results / "B1.json", lambda doc: doc["figures"][0].update(value=0.5, **{"pass": False}))
    table = mt.render(results)
    assert table != readme_block
    b1 = next(line for line in table.splitlines() if line.startswith("| B1 |"))
    assert "| 0.50x | >= 0.9 | **no** | 2026-11-21 |" in b1

    _edit(results / "peer.json", lambda doc: doc.update(ratio_of_medians=3.1))
    assert "| 3.10x (" in mt.render(results)


def test_every_row_has_a_value_and_every_suite_row_a_goal_date_and_machine(results):
    rows = [row for path in sorted(results.glob("*.json")) for row in mt.rows_of(path)]
    assert {row.source for row in rows} >= {f"B{n}" for n in range(1, 9)} | {"peer", "GPU"}
    for row in rows:
        assert row.value and row.value != mt.NONE
        if row.source.startswith("B"):
            assert mt.NONE not in (row.goal, row.met, row.date, row.machine), row


def test_a_file_of_unknown_shape_fails_loudly(results):
    (results / "B9.json").write_text(json.dumps({"id": "B9", "value": 1.0}))
    with pytest.raises(ValueError, match="no reader for this result file"):
        mt.render(results)


def test_a_known_file_missing_a_field_fails_loudly(results):
    _edit(results / "gpu.json", lambda doc: doc.pop("gpu_over_cpu_wall"))
    with pytest.raises(ValueError, match="gpu.json: not the shape"):
        mt.render(results)


def test_a_smoke_result_is_refused(results):
    _edit(results / "B2.json", lambda doc: doc.update(smoke=True))
    with pytest.raises(ValueError, match="smoke"):
        mt.render(results)


def test_write_replaces_only_the_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\nintro\n{mt.START}\nold\n{mt.END}\n\n## After\n")
    new = dt.write_blocks(doc, {(mt.START, mt.END): "| new |"})
    assert new == f"# Title\n\nintro\n{mt.START}\n| new |\n{mt.END}\n\n## After\n"
    assert doc.read_text() == new and mt.block_in(new) == "| new |"
    # The Measured table is never appended: a doc without its markers is refused, unchanged.
    doc.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        dt.write_blocks(doc, {(mt.START, mt.END): "| new |"})
    assert doc.read_text() == "# no markers\n"


def test_the_suite_ratio_row_holds_its_goal(tmp_path):
    suite = {
        "when": "2026-01-02 03:04:05",
        "machine": {"cpus": 2, "memory_gib": 23.5, "platform": "x"},
        "peer_s": [20.0, 21.0, 30.0],
        "suite_s": 1260.0,
        "ratio": 60.0,
        "goal_x": 65,
        "exit_code": 0,
    }
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    (row,) = mt.rows_of(tmp_path / "suite.json")
    assert (row.source, row.goal, row.met) == ("suite", "≤ 65x, all pass", "yes")
    assert row.value.startswith("60") and "(21.0 min vs 21.0 s)" in row.value
    for change in ({"ratio": 70.0}, {"exit_code": 1}):
        (tmp_path / "suite.json").write_text(json.dumps({**suite, **change}))
        assert mt.rows_of(tmp_path / "suite.json")[0].met == "**no**"
