"""The memory a process tree takes while a benchmark runs, sampled in a thread.

``PeakSampler`` keeps the peaks and the time series of the RSS and the PSS summed over the tree
(and of an optional gauge such as the object store's bytes); ``rss_and_pss`` reads one process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from benchmarks.harness import log
from benchmarks.process_tree import psutil_module


class MemorySample(NamedTuple):
    """One sample of a process tree: seconds since sampling began, summed RSS and PSS (bytes),
    and the optional extra gauge."""

    seconds: float
    rss: int
    pss: int
    extra: float | None


def rss_and_pss(proc) -> tuple[int, int]:
    """(RSS, PSS) bytes of one psutil process.

    PSS (proportional set size) splits each shared page among the processes that map it, so
    PSS summed over a tree counts every page once: libtorch mapped by six workers, or the object
    store's shared memory, count once, as they take memory once. RSS counts them in each
    process. PSS comes from ``/proc/PID/smaps_rollup`` (Linux >= 4.14); elsewhere it is RSS.
    """
    rss = proc.memory_info().rss
    try:
        with open(f"/proc/{proc.pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return rss, int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, rss


class PeakSampler:
    """Samples, every ``interval`` s in a thread, the RSS and the PSS summed over a process tree
    and an optional extra gauge (e.g. object-store bytes); keeps the peaks and the time series.

    Summed PSS is the memory the tree takes together (see `rss_and_pss`); summed RSS over-states
    it by every shared page's extra mappings, and is kept beside it because earlier figures
    were RSS.
    """

    def __init__(
        self,
        root_pid: int | None = None,
        interval: float = 0.2,
        extra: Callable[[], float | None] | None = None,
    ) -> None:
        self.root_pid = root_pid or os.getpid()
        self.interval = interval
        self.extra = extra
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.peak_extra: float | None = None
        self.series: list[MemorySample] = []
        # CPU seconds the sampling itself took (reading /proc of every process), so that a
        # figure measured under it can say what it cost.
        self.cpu_seconds = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def memory_now(self) -> tuple[int, int, int]:
        """(summed RSS, summed PSS, processes counted) of the tree now."""
        psutil = psutil_module()
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0, 0, 0
        total_rss = total_pss = counted = 0
        for proc in procs:
            try:
                rss, pss = rss_and_pss(proc)
            except psutil.Error:
                continue
            total_rss += rss
            total_pss += pss
            counted += 1
        return total_rss, total_pss, counted

    def sample(self) -> None:
        cpu_started = time.thread_time()
        rss, pss, procs = self.memory_now()
        extra = None
        if self.extra is not None:
            try:
                extra = self.extra()
            except Exception:  # a gauge that fails once must not stop the sampling
                extra = None
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, procs)
        if extra is not None:
            self.peak_extra = extra if self.peak_extra is None else max(self.peak_extra, extra)
        seconds = round(time.monotonic() - self._started, 2)
        self.series.append(MemorySample(seconds, rss, pss, extra))
        self.cpu_seconds += time.thread_time() - cpu_started

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception as exc:  # keep sampling; say once what went wrong
                if not self.errors:
                    log(f"memory sampler: {type(exc).__name__}: {exc}")
                self.errors.append(str(exc))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def __enter__(self) -> PeakSampler:
        psutil_module()  # import here, on the caller's thread (Ray's import wants the main one)
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="peak-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample()  # one last sample at the end

    def thin_series(self, points: int = 60) -> list[MemorySample]:
        step = max(1, len(self.series) // points)
        return self.series[::step]
