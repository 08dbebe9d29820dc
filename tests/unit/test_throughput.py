"""An epoch's throughput: rows (or tokens) per second and the share spent waiting for data."""

from __future__ import annotations

import time

import pytest
import torch

from training.loop.throughput import EpochClock


def _slow_batches(count: int, wait_s: float):
    for index in range(count):
        time.sleep(wait_s)  # the data iterator is slow
        yield index


def test_waits_for_batches_are_the_data_wait_share():
    clock = EpochClock()
    for _ in clock.batches(_slow_batches(4, 0.05)):
        time.sleep(0.05)  # the step takes as long as the wait
        clock.trained(32)
    figures = clock.metrics(lambda values: values, tokens=False)
    assert figures["data_wait_share"] == pytest.approx(0.5, abs=0.15)
    assert figures["train_rows_per_s"] == pytest.approx(128 / 0.4, rel=0.3)


def test_ranks_add_their_rows_and_average_their_time():
    clock = EpochClock()
    for _ in clock.batches(range(3)):
        clock.trained(10)
    time.sleep(0.1)

    def two_equal_ranks(values: torch.Tensor) -> torch.Tensor:
        return values * 2

    figures = clock.metrics(two_equal_ranks, tokens=True)
    assert set(figures) == {"train_tokens_per_s", "data_wait_share"}
    # 60 tokens over a mean of ~0.1 s per rank
    assert figures["train_tokens_per_s"] == pytest.approx(600, rel=0.3)
    assert figures["data_wait_share"] < 0.1
