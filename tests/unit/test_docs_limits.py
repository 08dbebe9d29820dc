"""Limits that hold themselves: README and docs stay short and describe the present, and the code
speaks of behaviours, not of issue numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
README_MOST_LINES = 200
DOC_MOST_LINES = 400
# A date in prose is a diary; a measured figure's date belongs in a generated table.
DATED = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2}\b"
    r"|\bthis session\b|\byesterday\b|\bthis (?:morning|evening)\b",
    re.IGNORECASE,
)
GENERATED = re.compile(r"<!-- ([\w-]+):start .*?-->.*?<!-- \1:end -->", re.DOTALL)
ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)
CODE_DIRS = ("trainflow", "deployments", "flows", "tasks", "training", "tests", "benchmarks")


def _prose(text: str) -> str:
    """``text`` without the blocks the benchmark harness generates (their dates are data)."""
    return GENERATED.sub("", text)


def test_the_readme_stays_short():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MOST_LINES, f"README.md: {len(lines)} lines"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_a_doc_stays_short(doc):
    lines = doc.read_text().splitlines()
    assert len(lines) <= DOC_MOST_LINES, f"{doc.name}: {len(lines)} lines"


@pytest.mark.parametrize("doc", [REPO_ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_no_dated_diary_lines(doc):
    dated = [
        line.strip()[:100] for line in _prose(doc.read_text()).splitlines() if DATED.search(line)
    ]
    assert dated == [], f"{doc.name}: the present only (a date belongs in a generated table)"


def test_generated_blocks_are_exempt_but_prose_is_not():
    text = "a 2026-11-27 line\n<!-- t:start x -->\n| 2026-11-27 |\n<!-- t:end -->\n"
    assert [line for line in _prose(text).splitlines() if DATED.search(line)] == [
        "a 2026-11-27 line"
    ]


def test_the_code_names_behaviours_not_issue_numbers():
    files = [REPO_ROOT / "Makefile", *(REPO_ROOT / ".ci").iterdir()]
    for top in (*CODE_DIRS, "examples"):
        files += sorted((REPO_ROOT / top).rglob("*.py"))
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for path in files
        if path.is_file()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert found == []
