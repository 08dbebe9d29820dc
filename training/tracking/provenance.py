"""What made a pipeline run: the versions of the packages it ran on and the git commit."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

VERSIONED_PACKAGES = ("torch", "ray", "prefect", "mlflow", "trainflow")
# training/tracking/provenance.py -> the repository root
REPO_ROOT = Path(__file__).resolve().parents[2]


def package_versions() -> dict[str, str]:
    """Tags ``version.<package>`` of the packages installed here."""
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def git_commit() -> str | None:
    """The commit checked out where trainflow runs from; None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit) else None


def provenance_tags() -> dict[str, str]:
    """The tags a new pipeline run carries: package versions and, in a checkout, the commit."""
    tags = package_versions()
    commit = git_commit()
    if commit:
        tags.update({"git.commit": commit, "mlflow.source.git.commit": commit})
    return tags
