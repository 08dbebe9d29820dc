"""Freed heap handed back to the OS in our long-lived processes (glibc's ``malloc_trim``).

glibc keeps memory that a process freed in its arenas for reuse, and gives back only what
lies at the top of a heap; the rest stays resident, idle, for the life of the process. A Ray
worker that read and transformed a few large parquet blocks kept ~500 MiB of it (a 6M-row
``mixed`` table, 2026-11-27: ``malloc_trim(0)`` in such an idle worker took its anonymous
memory from 650 to 132 MiB), and the workers live until the run ends: at 10M rows four of
them were most of the growth of the run's peak over the 1M-row run's.

``keep_releasing`` starts one daemon thread per process that looks, once a second, at how
much the heap holds free (``mallinfo2``: a walk of the free lists, microseconds) and trims it
when that grew by ``RELEASE_ABOVE_BYTES`` since the last look that trimmed: a process that
frees nothing is never trimmed, and one that churns is trimmed at most once a second. Elsewhere
than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

#: Free heap grown by this much since the last trim is given back.
RELEASE_ABOVE_BYTES = 32 * 1024**2
#: Seconds between two looks at the heap.
INTERVAL_S = 1.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_lock = threading.Lock()
_started_in: int | None = None  # the pid whose thread runs (a forked child starts its own)
_libc: ctypes.CDLL | None | bool = False  # False: not looked up yet; None: not glibc


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc with ``malloc_trim`` and ``mallinfo2`` (>= 2.33)."""
    global _libc
    if _libc is False:
        name = ctypes.util.find_library("c")
        library = ctypes.CDLL(name) if name else None
        if library is None or not all(
            hasattr(library, f) for f in ("malloc_trim", "mallinfo2", "gnu_get_libc_version")
        ):
            library = None
        else:
            library.mallinfo2.restype = _MallInfo2
            library.malloc_trim.argtypes = [ctypes.c_size_t]
        _libc = library
    return _libc


def free_heap_bytes() -> int | None:
    """Bytes the heap holds free (resident or already trimmed), or None without glibc."""
    libc = _glibc()
    return None if libc is None else int(libc.mallinfo2().fordblks)


def release_freed() -> bool:
    """Give every whole free page of the heap back to the OS now; True if any was."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


class _Releaser:
    """Trims when the free heap grew by ``threshold`` since the lowest it was after a trim."""

    def __init__(self, threshold: int = RELEASE_ABOVE_BYTES) -> None:
        self.threshold = threshold
        self.base = 0  # free bytes right after the last trim, lowered as they are reused

    def look(self, free: int) -> bool:
        """One look at ``free`` bytes; True when it trimmed."""
        self.base = min(self.base, free)
        if free - self.base < self.threshold:
            return False
        release_freed()
        self.base = free  # trimmed pages stay on the free lists: counted from here on
        return True


def _run(stop: threading.Event) -> None:
    releaser = _Releaser()
    while not stop.wait(INTERVAL_S):
        free = free_heap_bytes()
        if free is None:
            return
        releaser.look(free)


def keep_releasing() -> None:
    """Start this process's releasing thread, once (cheap to call again: every batch may)."""
    global _started_in
    if _started_in == os.getpid():
        return
    with _lock:
        if _started_in == os.getpid():
            return
        _started_in = os.getpid()
        if _glibc() is not None:
            threading.Thread(
                target=_run, args=(threading.Event(),), name="trainflow-heap-release", daemon=True
            ).start()
