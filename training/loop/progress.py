"""The final training's progress in the driver: epochs done, the validation metric, restarts.

Ray Train runs its callbacks in the controller actor, not in the driver where the console is.
A ``UserCallback`` there forwards each report through a ``ray.util.queue.Queue``; a thread of the
driver turns them into progress events while ``fit()`` runs, and with ``train.engine: function``
into the run's history (``training.loop.function_reports.ReportHistory``). The train line also
names the Ray Dashboard, which can be opened while the run lasts.

Each epoch's row also goes to ``on_epochs`` (the MLflow train run) once a checkpoint holds it:
an epoch reported after the last checkpoint is trained and reported again after a restart, and
a run stopped mid-way keeps in MLflow exactly the epochs its resume will not repeat.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ray.train.v2.api.callback import UserCallback

from training import progress
from training.loop.function_reports import ReportHistory

_POLL_S = 0.5
# After a send failed, the next waits this long: each send to a server that does not answer
# costs seconds of MLflow's retries, and the rows of every epoch in between wait in order.
RETRY_AFTER_S = 10.0
logger = logging.getLogger(__name__)

EpochSink = Callable[[list[dict[str, Any]]], None]


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


class _CheckpointedEpochs:
    """Epoch rows held until a checkpoint covers them, then handed to the sink; dropped on a
    restart (the group resumes from that checkpoint and reports them again). A sink that fails
    (a tracking server's blip) gets the rows again with the first checkpoint's at least
    ``retry_after_s`` later."""

    def __init__(
        self,
        sink: EpochSink | None,
        retry_after_s: float = RETRY_AFTER_S,
        clock=time.monotonic,
    ) -> None:
        self._sink = sink
        self._pending: list[dict[str, Any]] = []
        self._retry_after_s, self._clock = retry_after_s, clock
        self._next_try = float("-inf")

    def add(self, row: dict[str, Any], checkpointed: bool) -> None:
        if self._sink is None:
            return
        self._pending.append(row)
        if checkpointed:
            self.flush()

    def restarted(self) -> None:
        self._pending.clear()

    def flush(self) -> None:
        if not self._pending or self._clock() < self._next_try:
            return
        try:
            self._sink(list(self._pending))
        except Exception as exc:  # training goes on; the run's end logs the whole history
            logger.warning("epoch metrics not logged yet (%s); retrying later", exc)
            self._next_try = self._clock() + self._retry_after_s
            return
        self._pending.clear()


class _Follower:
    """In the driver: counts restarts, reports each epoch, keeps a function's history."""

    def __init__(
        self,
        max_epochs: int,
        metric: str,
        history: ReportHistory | None = None,
        dashboard: str | None = None,
        on_epochs: EpochSink | None = None,
    ) -> None:
        self.max_epochs, self.metric, self.history = max_epochs, metric, history
        self.restarts = 0
        self.dashboard = f" · Ray Dashboard {dashboard}" if dashboard else ""
        self.epochs = _CheckpointedEpochs(on_epochs)

    def started(self, workers: str) -> None:
        progress.report("train", f"starting {workers} worker(s){self.dashboard}")

    def handle(self, item: dict[str, Any]) -> None:
        if "failed_ranks" in item:
            self.restarts += 1
            if self.history is not None:
                self.history.restarted()
            self.epochs.restarted()
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
        self.epochs.add(metrics, item["checkpointed"])
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
    on_epochs: EpochSink | None = None,
) -> Iterator[list]:
    """Yields the Train callbacks to add to the RunConfig; reports until the block ends.
    ``history``: filled from the reports (a user's function); ``dashboard``: the Ray
    Dashboard's URL, shown on the train line; ``on_epochs``: gets each epoch's row once a
    checkpoint holds it."""
    from ray.util.queue import Empty, Queue

    queue = Queue(actor_options={"num_cpus": 0})
    follower = _Follower(max_epochs, metric, history, dashboard, on_epochs)
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
