"""The final training's epochs reach the train run while it trains, once a checkpoint holds them."""

from __future__ import annotations

import pytest

from training.loop.progress import RETRY_AFTER_S, _Follower


def _report(epoch: int, checkpointed: bool = True) -> dict:
    return {
        "report": {"epoch": epoch, "val_accuracy": 0.5 + epoch / 100},
        "checkpointed": checkpointed,
    }


@pytest.fixture
def logged() -> list[list[int]]:
    return []


def _follower(logged: list[list[int]], sink=None, history=None) -> _Follower:
    def record(rows):
        logged.append([int(r["epoch"]) for r in rows])

    return _Follower(10, "val_accuracy", history=history, on_epochs=sink or record)


def test_each_checkpointed_epoch_is_handed_over_as_it_arrives(logged):
    follower = _follower(logged)
    for epoch in (1, 2, 3):
        follower.handle(_report(epoch))
    assert logged == [[1], [2], [3]]


def test_epochs_wait_for_the_checkpoint_that_holds_them(logged):
    follower = _follower(logged)
    follower.handle(_report(1, checkpointed=False))
    follower.handle(_report(2, checkpointed=False))
    assert logged == []
    follower.handle(_report(3))
    assert logged == [[1, 2, 3]]


def test_a_restart_drops_the_epochs_no_checkpoint_holds(logged):
    follower = _follower(logged)
    follower.handle(_report(1))
    follower.handle(_report(2, checkpointed=False))
    follower.handle({"failed_ranks": [1]})
    follower.handle(_report(2))  # trained and reported again after the restart
    assert logged == [[1], [2]]


def test_mid_epoch_reports_are_not_epochs(logged):
    follower = _follower(logged)
    follower.handle({"report": {"epoch_in_progress": 1}, "checkpointed": True})
    assert logged == []


def test_a_failing_sink_gets_the_rows_again_with_the_next_checkpoint(logged):
    calls: list[list[int]] = []

    def flaky(rows):
        calls.append([int(r["epoch"]) for r in rows])
        if len(calls) == 1:
            raise ConnectionError("tracking server away")

    now = [0.0]
    follower = _follower(logged, sink=flaky)
    follower.epochs._clock = lambda: now[0]
    follower.handle(_report(1))  # the server is away: kept, training goes on
    now[0] += RETRY_AFTER_S
    follower.handle(_report(2))
    assert calls == [[1], [1, 2]]


def test_after_a_failed_send_the_rows_wait_a_while_before_the_next(logged):
    """Each send to a server that does not answer costs seconds of retries: not one an epoch."""
    calls: list[list[int]] = []

    def away(rows):
        calls.append([int(r["epoch"]) for r in rows])
        if len(calls) < 3:
            raise ConnectionError("tracking server away")

    now = [0.0]
    follower = _follower(logged, sink=away)
    follower.epochs._clock = lambda: now[0]
    for epoch in (1, 2, 3):  # within RETRY_AFTER_S of the failure: not sent
        follower.handle(_report(epoch))
        now[0] += RETRY_AFTER_S / 4
    assert calls == [[1]]
    now[0] += RETRY_AFTER_S
    follower.handle(_report(4))  # fails again
    follower.handle(_report(5))
    now[0] += RETRY_AFTER_S
    follower.handle(_report(6))
    assert calls == [[1], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]
