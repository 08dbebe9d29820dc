"""Each training node's CPU, memory, disk, network (and GPU) use on the MLflow train run.

MLflow's own ``SystemMetricsMonitor`` samples in a thread of the first worker of every Ray node
(one sampler a node, not one a worker), its metrics named ``system/node_<index>/...`` (nodes
numbered in the order of their first rank) so a straggler or an idle GPU shows on its node. The
worker reaches the tracking server as the driver does; a tracking URI that carries credentials is
not handed to the workers, and the monitor is not started. A monitor that cannot log stops with a
warning in the worker's log; training never waits on it, nor on its last samples for more than
``FINISH_WAIT_S``: while the tracking server does not answer, the monitor's last request sits
in MLflow's retries for minutes, and the run's outage grace is what decides how long to wait.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)
FINISH_WAIT_S = 10.0


@dataclass(frozen=True)
class SystemMetricsTarget:
    """Where the workers log: the train run, its tracking URI, and how often they sample."""

    run_id: str
    tracking_uri: str
    interval_s: float

    @classmethod
    def of(cls, run_id: str, tracking_uri: str, interval_s: float) -> SystemMetricsTarget | None:
        """None where sampling is off or the URI holds credentials (they stay in the driver)."""
        if interval_s <= 0:
            return None
        parts = urlsplit(tracking_uri)
        if parts.username or parts.password:
            logger.info("system metrics off: the tracking URI carries credentials")
            return None
        return cls(run_id, tracking_uri, interval_s)


class MonitoredWorker:
    """``train_loop_per_worker`` with MLflow's system-metrics monitor around it on the first
    worker of each node."""

    def __init__(self, train_fn, target: SystemMetricsTarget) -> None:
        self.train_fn, self.target = train_fn, target

    def __call__(self, settings: dict[str, Any]) -> Any:
        monitor = _start_monitor(self.target)
        try:
            return self.train_fn(settings)
        finally:
            if monitor is not None:
                monitor.finish()


def monitored(train_fn, target: SystemMetricsTarget | None):
    """``train_fn`` itself without a target, else wrapped in :class:`MonitoredWorker`."""
    return train_fn if target is None else MonitoredWorker(train_fn, target)


def sampling(target: SystemMetricsTarget | None):
    """What wraps a TorchTrainer's worker so it samples to ``target`` (None: nothing to do)."""
    return None if target is None else functools.partial(monitored, target=target)


class _BackgroundMonitor:
    """MLflow's monitor, built in a thread of its own: importing MLflow and opening its store
    take seconds of a worker's start that training need not wait for."""

    def __init__(self, target: SystemMetricsTarget, node_index: int) -> None:
        self._target, self._node_index = target, node_index
        self._lock = threading.Lock()
        self._monitor = None
        self._finished = False
        threading.Thread(target=self._build, name="trainflow-system-metrics", daemon=True).start()

    def _build(self) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            monitor = SystemMetricsMonitor(
                self._target.run_id,
                sampling_interval=self._target.interval_s,
                # A restarted group goes on from the run's last step instead of writing over it.
                resume_logging=True,
                node_id=f"node_{self._node_index}",
                tracking_uri=self._target.tracking_uri,
            )
        except Exception as exc:  # sampling is an aid: never the reason a training fails
            logger.warning("system metrics not sampled on this node: %s", exc)
            return
        with self._lock:
            if not self._finished:  # a training shorter than the build samples nothing
                monitor.start()
                self._monitor = monitor

    def finish(self, wait_s: float = FINISH_WAIT_S) -> None:
        with self._lock:
            self._finished = True
            monitor = self._monitor
        if monitor is None:
            return
        last = threading.Thread(target=monitor.finish, name="trainflow-system-metrics-end")
        last.daemon = True  # a server that does not answer must not hold the worker's exit
        last.start()
        last.join(wait_s)
        if last.is_alive():
            logger.warning(
                "system metrics: the last samples not logged within %g s (the tracking server "
                "does not answer); training goes on",
                wait_s,
            )


def _start_monitor(target: SystemMetricsTarget) -> _BackgroundMonitor | None:
    first_on_node, node_index = _placement()
    if not first_on_node:
        return None
    return _BackgroundMonitor(target, node_index)


def _placement() -> tuple[bool, int]:
    """(whether this worker is the lowest rank on its Ray node, that node's index in rank order).

    By Ray node id, not by address as Ray Train's local and node ranks go: nodes that share an
    address (several on one host) are still told apart. Every worker takes part, once, before
    training; a process group on NCCL gets a Gloo one for the exchange of plain strings."""
    import ray
    import torch.distributed as dist

    node = ray.get_runtime_context().get_node_id()
    if not dist.is_available() or not dist.is_initialized():
        return True, 0
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    nodes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node, group=group)
    in_rank_order = list(dict.fromkeys(nodes))
    return nodes.index(node) == dist.get_rank(), in_rank_order.index(node)
