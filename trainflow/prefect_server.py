"""Prefect's temporary server, started while the CLI still imports the pipeline.

With no Prefect API URL, Prefect's client starts a temporary server the first time a flow needs
it: a uvicorn process that imports Prefect's server and migrates its database (12-18 s on 2
cores in a fresh home). Until then the CLI spends ~12 s importing Ray, torch and the pipeline.
Started first, in a thread, the server's start-up runs in its own process beside those imports.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)


class EarlyTemporaryServer:
    """Starts Prefect's own ``SubprocessASGIServer`` in a thread. It is the instance Prefect's
    client uses later (one per port, and the temporary server has none), so the flow finds it
    running; ``wait()`` before the flow runs."""

    def __init__(self) -> None:
        # Imported here, in the calling thread, not in the new one: two threads importing
        # Prefect's modules at once can meet in its circular imports. The flow's client would
        # import this module anyway.
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

        self._thread: threading.Thread | None = None
        # The same test as Prefect's client: a configured server, or no temporary one allowed.
        if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
            return
        self._thread = threading.Thread(
            target=self._start,
            args=(SubprocessASGIServer(),),
            name="prefect-temporary-server",
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _start(server) -> None:
        try:
            server.start()
            # Prefect's own "Starting temporary server" line is lost this early (its logging
            # is set up when the flow starts): say where the server is ourselves.
            logger.info("Prefect's temporary server started early on %s", server.address)
        except Exception:
            # Not started: the flow's own start tries again and reports what is wrong.
            logger.warning("Prefect's temporary server did not start early", exc_info=True)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def wait(self) -> None:
        """Return once the server answers (or its early start gave up)."""
        if self._thread is not None:
            self._thread.join()
