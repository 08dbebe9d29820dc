"""The final training's progress in the driver: epochs done, the validation metric, restarts.

Ray Train runs its callbacks in the controller actor, not in the driver where the console is.
A ``UserCallback`` there forwards each epoch's report through a ``ray.util.queue.Queue``; a thread
of the driver turns them into progress events while ``fit()`` runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ray.train.v2.api.callback import UserCallback

from training import progress

_POLL_S = 0.5


class _ForwardReports(UserCallback):
    """On the controller: rank 0's epoch metrics and worker failures, into the queue."""

    def __init__(self, queue) -> None:
        self._queue = queue

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        first = metrics[0] if metrics else {}
        if "epoch" in first:  # mid-epoch checkpoints report "epoch_in_progress" instead
            self._queue.put_nowait({"epoch": first})

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        self._queue.put_nowait({"failed_ranks": sorted(worker_exceptions)})


class _Follower:
    """In the driver: counts restarts and reports each epoch."""

    def __init__(self, max_epochs: int, metric: str) -> None:
        self.max_epochs, self.metric = max_epochs, metric
        self.restarts = 0

    def handle(self, item: dict[str, Any]) -> None:
        if "failed_ranks" in item:
            self.restarts += 1
            ranks = ", ".join(str(r) for r in item["failed_ranks"])
            progress.report(
                "train",
                f"worker(s) {ranks} failed; Ray Train restarts the group from the last checkpoint",
                restarts=self.restarts,
            )
            return
        metrics = item["epoch"]
        epoch = int(metrics["epoch"])
        value = metrics.get(self.metric)
        shown = f", {self.metric} {value:.4f}" if isinstance(value, int | float) else ""
        progress.report(
            "train",
            f"epoch {epoch}/{self.max_epochs}{shown}",
            epoch=epoch,
            total=self.max_epochs,
            metric=self.metric,
            value=value,
            restarts=self.restarts,
        )


@contextlib.contextmanager
def training_progress(max_epochs: int, metric: str) -> Iterator[list]:
    """Yields the Train callbacks to add to the RunConfig; reports until the block ends."""
    from ray.util.queue import Empty, Queue

    queue = Queue(actor_options={"num_cpus": 0})
    follower = _Follower(max_epochs, metric)
    stop = threading.Event()

    def drain(block: bool) -> None:
        while True:
            try:
                item = queue.get(block=block, timeout=_POLL_S) if block else queue.get_nowait()
            except Empty:
                return
            follower.handle(item)

    def follow() -> None:
        while not stop.is_set():
            drain(block=True)

    thread = threading.Thread(target=follow, name="trainflow-train-progress", daemon=True)
    thread.start()
    try:
        yield [_ForwardReports(queue)]
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(Exception):  # what the last epochs sent before fit() returned
            drain(block=False)
        queue.shutdown(force=True)
