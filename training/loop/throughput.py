"""An epoch's throughput, as the Ray Train guides read it to find a starved or slow worker.

``train_rows_per_s`` (``train_tokens_per_s`` for a language model): the rows (tokens) every rank
trained this epoch, over the ranks' mean time in the epoch's training phase. ``data_wait_share``:
the share of that time the ranks spent waiting on the Ray Data iterator for their next batch.
Validation is outside both. Rows trained before a restart (a mid-epoch resume) are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch


class EpochClock:
    """Times one rank's training phase and the waits for its batches."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._waited = 0.0
        self._units = 0

    def batches(self, batches: Iterable) -> Iterator:
        """``batches``, timing each wait for the next one."""
        iterator = iter(batches)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._waited += time.perf_counter() - asked
            yield batch

    def trained(self, units: int) -> None:
        self._units += int(units)

    def metrics(self, all_reduce_sum, tokens: bool) -> dict[str, float]:
        """The epoch's figures over all ranks (``all_reduce_sum`` sums a tensor across them)."""
        elapsed = time.perf_counter() - self._started
        totals = all_reduce_sum(
            torch.tensor([self._units, self._waited, elapsed, 1.0], dtype=torch.float64)
        )
        units, waited, elapsed_sum, ranks = (float(v) for v in totals)
        mean_elapsed = elapsed_sum / max(ranks, 1.0)
        key = "train_tokens_per_s" if tokens else "train_rows_per_s"
        figures: dict[str, Any] = {
            key: units / mean_elapsed if mean_elapsed > 0 else 0.0,
            "data_wait_share": waited / elapsed_sum if elapsed_sum > 0 else 0.0,
        }
        return figures
