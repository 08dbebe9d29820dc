"""Start a run's services side by side before its flow begins.

A one-off ``trainflow run`` needs Prefect's temporary server (~10 s to answer in a fresh home),
MLflow's store (~5 s to create its tables in a fresh home) and a local Ray instance (~5 s). The
flow would start them one after another; here Prefect's server starts in a thread (it is a
subprocess; the thread only waits for its health check) while this process prepares MLflow and
then Ray. The flow then finds all three ready: Prefect's client reuses the same server object,
``store.configure`` and ``cluster.connect`` are idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from training.config import PipelineConfig
from training.errors import TrainflowError

log = logging.getLogger(__name__)


def _start_temporary_prefect_server() -> None:
    """Prefect's own ephemeral server, the one its client would start on first use."""
    from prefect.server.api.server import SubprocessASGIServer

    try:
        SubprocessASGIServer().start()
    except Exception as exc:  # the flow's client tries again and reports it properly
        log.warning("temporary Prefect server did not start ahead of the flow: %s", exc)


@contextlib.contextmanager
def warm_services(config: PipelineConfig) -> Iterator[None]:
    """Prefect's temporary server (when no API URL is set), MLflow's store and Ray, started
    together; Ray is shut down on the way out whatever happens."""
    from prefect.settings import PREFECT_API_URL

    from training import cluster
    from training.tracking import store

    prefect = None
    if not PREFECT_API_URL.value():
        prefect = threading.Thread(
            target=_start_temporary_prefect_server, name="prefect-server-start", daemon=True
        )
        prefect.start()
    try:
        try:
            # MLflow before Ray, as in the flow. A failure here is left to the flow, which
            # meets it again and reports it where users look (console and Prefect's logs).
            store.configure(config)
            cluster.connect(config.ray)
        except TrainflowError as exc:
            log.info("left to the flow to report: %s", exc)
        if prefect is not None:
            prefect.join()
        yield
    finally:
        cluster.shutdown()
