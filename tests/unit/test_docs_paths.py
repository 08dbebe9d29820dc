"""The docs name what exists: every repository path docs/architecture.md names in backticks, and
every local file README.md and docs/*.md link to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
LINKED_DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]

# A backticked token that is a path: plain path characters only (no <placeholders>, globs,
# URLs or spaces), with a "/" or a ".py" ending; a ":name" after a .py file is dropped.
_PATH = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def repo_paths(text: str) -> list[str]:
    """Paths named in backticks (relative to the repository root), in order, without repeats."""
    found: list[str] = []
    for token in re.findall(r"`([^`\n]+)`", text):
        if ".py:" in token:
            token = token.split(":", 1)[0]
        if not _PATH.fullmatch(token) or token.startswith("."):
            continue
        if ("/" in token or token.endswith(".py")) and token not in found:
            found.append(token)
    return found


def local_links(text: str) -> list[str]:
    """Link targets that are files of this repository (no URLs, no in-page anchors)."""
    targets = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_path_extraction_keeps_paths_and_skips_the_rest():
    text = (
        "`training/loop/loop.py` `flows/pipeline.py:pipeline` `deployments/kuberay/` "
        "`training/stages/` `setup.py` `<root>/runs/<run_id>` `s3://bucket/prefix` "
        "`configs/*.yaml` `torch.load` `num_workers: [min, max]` `~/.cache/trainflow/` "
        "`training/loop/loop.py` `a b/c`"
    )
    assert repo_paths(text) == [
        "training/loop/loop.py",
        "flows/pipeline.py",
        "deployments/kuberay/",
        "training/stages/",
        "setup.py",
    ]


def test_link_extraction_keeps_local_files_only():
    text = (
        "[a](docs/serving.md) [b](https://example.com/x.md) [c](#measured) "
        "![d](scale-memory-s3.png) [e](reliability.md#ports) [f](mailto:x@example.com)"
    )
    assert local_links(text) == ["docs/serving.md", "scale-memory-s3.png", "reliability.md"]


def _missing(paths: list[str], base: Path) -> list[str]:
    missing = []
    for path in paths:
        target = base / path
        exists = target.is_dir() if path.endswith("/") else target.exists()
        if not exists:
            missing.append(path)
    return missing


def test_a_missing_path_is_found(tmp_path):
    (tmp_path / "there.py").write_text("")
    (tmp_path / "pkg").mkdir()
    assert _missing(["there.py", "pkg/", "gone.py", "there.py/"], tmp_path) == [
        "gone.py",
        "there.py/",
    ]


def test_every_path_the_architecture_names_exists():
    paths = repo_paths(ARCHITECTURE.read_text())
    assert len(paths) > 20, "the path extraction found almost nothing: is the pattern broken?"
    missing = _missing(paths, REPO_ROOT)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_local_links_resolve(doc):
    missing = _missing(local_links(doc.read_text()), doc.parent)
    assert not missing, f"{doc.relative_to(REPO_ROOT)} links to files that do not exist: {missing}"
