"""Freed heap given back to the OS (training.platform.heap)."""

from __future__ import annotations

import threading

import pytest

from training.platform import heap

MIB = 1024**2
needs_glibc = pytest.mark.skipif(heap.free_heap_bytes() is None, reason="needs glibc >= 2.33")


def _anon_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.fixture
def trims(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "release_freed", lambda: calls.append(1) or True)
    return calls


def test_trims_only_when_the_free_heap_grew_by_the_threshold_since_the_last_trim(trims):
    releaser = heap._Releaser(threshold=100)
    assert not releaser.look(99)
    assert releaser.look(100)  # grew by 100 from nothing
    assert len(trims) == 1
    # Trimmed pages stay on the free lists: the same free bytes are not trimmed again.
    assert not releaser.look(150)
    assert len(trims) == 1
    assert releaser.look(200)
    assert len(trims) == 2


def test_free_bytes_reused_lower_the_mark_a_later_free_is_measured_from(trims):
    releaser = heap._Releaser(threshold=100)
    releaser.look(500)  # trims; 500 free from now on
    releaser.look(50)  # most of it reused
    assert releaser.look(160)  # then 110 freed again
    assert len(trims) == 2


@needs_glibc
def test_release_freed_gives_a_fragmented_heap_back_to_the_os():
    # 64 KiB blocks come from the heap (under glibc's mmap threshold); one kept in every eight
    # pins the heap, so free() alone gives nothing back but its very top.
    blocks = [bytearray(64 * 1024) for _ in range(4096)]  # 256 MiB
    kept = blocks[::8]
    del blocks
    before = _anon_bytes()
    assert heap.release_freed()
    assert before - _anon_bytes() > 100 * MIB
    assert len(kept) == 512


def test_keep_releasing_starts_one_thread_per_process():
    heap.keep_releasing()
    heap.keep_releasing()
    names = [t.name for t in threading.enumerate()]
    expected = 0 if heap.free_heap_bytes() is None else 1
    assert names.count("trainflow-heap-release") == expected
