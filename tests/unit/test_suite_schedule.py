"""The suite's schedule names real modules: a renamed module would silently lose its place
(longest first) or its partner (one worker for the modules that share a pipeline run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _suite_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", REPO_ROOT / "tests/conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_scheduled_module_exists():
    conftest = _suite_conftest()
    named = [*conftest.LONGEST_FIRST, *conftest.RUNS_WITH, *conftest.RUNS_WITH.values()]
    assert [path for path in named if not (REPO_ROOT / path).is_file()] == []


def test_a_module_runs_with_its_partner():
    conftest = _suite_conftest()

    class Fake(conftest.RunsWithPartners):
        def __init__(self):  # only the scope arithmetic, no xdist session
            pass

    fake = Fake()
    for module, partner in conftest.RUNS_WITH.items():
        assert fake._split_scope(f"{module}::test_x") == partner
    assert fake._split_scope("tests/unit/test_split.py::test_x[a::b]") == (
        "tests/unit/test_split.py"
    )


def test_no_two_test_modules_share_a_file_name():
    """The test directories are not packages: pytest imports each module by its file name, and a
    second module of the same name fails the whole module with "import file mismatch"."""
    names = [path.name for path in (REPO_ROOT / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []
