"""The final training's progress in the driver: epochs done, the validation metric, restarts.

Ray Train runs its callbacks in the controller actor, not in the driver where the console is.
A ``UserCallback`` there forwards each report through a ``ray.util.queue.Queue``; a thread of the
driver turns them into progress events while ``fit()`` runs, and with ``train.engine: function``
into the run's history (``training.loop.function_reports.ReportHistory``). The train line also
names the Ray Dashboard, which can be opened while the run lasts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ray.train.v2.api.callback import UserCallback

from training import progress
from training.loop.function_reports import ReportHistory

_POLL_S = 0.5


class _ForwardReports(UserCallback):
    """On the controller: rank 0's reports (and whether each carried a checkpoint) and worker
    failures, into the queue."""

    def __init__(self, queue) -> None:
        self._queue = queue

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        first = metrics[0] if metrics else {}
        self._queue.put_nowait({"report": first, "checkpointed": checkpoint is not None})

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        self._queue.put_nowait({"failed_ranks": sorted(worker_exceptions)})


class _Follower:
    """In the driver: counts restarts, reports each epoch, keeps a function's history."""

    def __init__(
        self,
        max_epochs: int,
        metric: str,
        history: ReportHistory | None = None,
        dashboard: str | None = None,
    ) -> None:
        self.max_epochs, self.metric, self.history = max_epochs, metric, history
        self.restarts = 0
        self.dashboard = f" · Ray Dashboard {dashboard}" if dashboard else ""

    def started(self, workers: str) -> None:
        progress.report("train", f"starting {workers} worker(s){self.dashboard}")

    def handle(self, item: dict[str, Any]) -> None:
        if "failed_ranks" in item:
            self.restarts += 1
            if self.history is not None:
                self.history.restarted()
            ranks = ", ".join(str(r) for r in item["failed_ranks"])
            progress.report(
                "train",
                f"worker(s) {ranks} failed; Ray Train restarts the group from the last "
                f"checkpoint{self.dashboard}",
                restarts=self.restarts,
            )
            return
        metrics = item["report"]
        if self.history is not None:  # a function's report is an epoch; trainflow numbers it
            metrics = self.history.add(metrics, item["checkpointed"])
        elif "epoch" not in metrics:  # the loop's mid-epoch checkpoints: "epoch_in_progress"
            return
        epoch = int(metrics["epoch"])
        value = metrics.get(self.metric)
        shown = f", {self.metric} {value:.4f}" if isinstance(value, int | float) else ""
        progress.report(
            "train",
            f"epoch {epoch}/{self.max_epochs}{shown}{self.dashboard}",
            epoch=epoch,
            total=self.max_epochs,
            metric=self.metric,
            value=value,
            restarts=self.restarts,
        )


@contextlib.contextmanager
def training_progress(
    max_epochs: int,
    metric: str,
    history: ReportHistory | None = None,
    dashboard: str | None = None,
    workers: str = "",
) -> Iterator[list]:
    """Yields the Train callbacks to add to the RunConfig; reports until the block ends.
    ``history``: filled from the reports (a user's function); ``dashboard``: the Ray
    Dashboard's URL, shown on the train line."""
    from ray.util.queue import Empty, Queue

    queue = Queue(actor_options={"num_cpus": 0})
    follower = _Follower(max_epochs, metric, history, dashboard)
    follower.started(workers)
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
