"""A process tree as psutil sees it: psutil itself (installed or Ray's copy), and stopping a
started command with everything under it."""

from __future__ import annotations

import contextlib
import os
import signal


def psutil_module():
    """psutil: installed, or the copy Ray vendors (``import ray`` puts it on sys.path)."""
    import importlib

    try:
        return importlib.import_module("psutil")
    except ImportError:
        # Ray ships psutil in ray/thirdparty_files and puts that folder on sys.path on import.
        importlib.import_module("ray")
        return importlib.import_module("psutil")


def kill_tree(proc) -> None:
    """SIGKILL a started command (a ``subprocess.Popen``), its process group and every
    descendant (by pid: Ray may leave the group), then reap them."""
    psutil = psutil_module()
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.kill()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # not a group leader: the group kill above missed it
    proc.wait(timeout=60)
    psutil.wait_procs(descendants, timeout=30)
