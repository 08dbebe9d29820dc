"""A fresh home's databases start as copies of empty, already migrated ones.

In every new trainflow home MLflow creates its tables (~5 s on 2 cores) and Prefect's temporary
server migrates its database and registers its block types (~6 s). The result is the same each
time for the same library version, so the first home keeps a copy (a *template*, in the user's
cache directory, named after the library and its version) and later fresh homes start from it.
A database that already exists is never touched, and a missing or unreadable template only
means the library migrates as it always did. ``TRAINFLOW_FAST_START=0`` (the start-up speed-ups'
one switch, trainflow/startup.py) turns templates off: every home migrates in place.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

from training.platform import fast_start

log = logging.getLogger(__name__)


def enabled() -> bool:
    return fast_start.enabled()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trainflow" / "db-templates"


def template_path(library: str, version: str) -> Path:
    return cache_dir() / f"{library}-{version}.sqlite"


def seed(
    target: Path, library: str, version: str, fix_up: Callable[[sqlite3.Connection], None] | None
) -> bool:
    """Copy the template of ``library`` at ``version`` to ``target`` if ``target`` does not exist
    yet; ``fix_up`` may change the copy (in one transaction) before it takes ``target``'s
    name. True if ``target`` now holds a copy."""
    template = template_path(library, version)
    if not enabled() or target.exists() or not template.is_file():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        shutil.copyfile(template, tmp)
        with sqlite3.connect(tmp) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master")  # a database at all?
            if fix_up is not None:
                fix_up(conn)
        conn.close()
        # Another process may have made the database meanwhile: theirs stays, ours goes.
        os.link(tmp, target)
        return True
    except (OSError, sqlite3.Error) as exc:
        log.debug("no %s template copied to %s: %s", library, target, exc)
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def save(source: Path, library: str, version: str) -> None:
    """Keep a consistent copy of ``source`` (just migrated, still empty) as the template of
    ``library`` at ``version``, unless one exists. SQLite's backup API reads it safely while
    its server has it open."""
    template = template_path(library, version)
    if not enabled() or template.exists() or not source.is_file():
        return
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{template.name}.", dir=template.parent)
        os.close(fd)
        try:
            with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src:
                with sqlite3.connect(tmp) as dst:
                    src.backup(dst)
                dst.close()
            src.close()
            os.replace(tmp, template)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except (OSError, sqlite3.Error) as exc:
        log.debug("no %s template saved from %s: %s", library, source, exc)
