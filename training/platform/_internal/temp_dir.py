"""Where a local Ray instance keeps its sessions: short enough for Unix socket paths."""

from __future__ import annotations

import tempfile
from pathlib import Path

from training.storage import trainflow_home

# The longest Unix socket path (108 bytes with the NUL) minus what Ray puts below its temp
# dir: "/session_<date>_<time>_<pid>/sockets/<name>" (pid up to 7 digits). The longest name is
# a dashboard module's, "dash_<Module>": dash_TaskEventsHead in Ray 2.60 (19 bytes; a home
# sized for plasma_store's 12 failed Ray's start with "Module MetricsHead failed to start").
# 24 leaves room for a longer module name in a later Ray.
LONGEST_RAY_SOCKET_NAME = 24
MAX_RAY_TEMP_DIR = (
    107 - len("/session_2026-11-23_11-49-38_123456_1234567/sockets/") - LONGEST_RAY_SOCKET_NAME
)


def ray_temp_dir(home: Path | None = None) -> Path:
    """Where the local Ray instance keeps its sessions: ``<home>/ray``.

    A home too deep for Unix socket paths gets a short directory of its own in the system
    temp dir, and ``<home>/ray`` links to it; later runs follow the link. (A directory named
    after the home's path was shared by every home ever made at that path: a new home at a
    path pytest had used before found the old homes' Ray sessions in its own.)
    """
    home = home or trainflow_home()
    wanted = home / "ray"
    if len(str(wanted)) <= MAX_RAY_TEMP_DIR:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    if wanted.is_symlink():
        short = wanted.resolve()
        short.mkdir(parents=True, exist_ok=True)  # the system may have cleaned its temp dir
        return short
    home.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix="trainflow-ray-", dir="/tmp"))
    if not wanted.exists():
        wanted.symlink_to(short, target_is_directory=True)
    return short
