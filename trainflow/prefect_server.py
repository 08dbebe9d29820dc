"""Prefect's temporary server, started while the CLI still imports the pipeline.

With no Prefect API URL, Prefect's client starts a temporary server the first time a flow needs
it: a uvicorn process that imports Prefect's server and migrates its database (12-18 s on 2
cores in a fresh home). Until then the CLI spends ~12 s importing Ray, torch and the pipeline.
Started first, in a thread, the server's start-up runs in its own process beside those imports.
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from training.platform import db_templates

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
        files = _DatabaseFiles.of_current_settings()
        seeded = files is not None and files.seed()
        self._thread = threading.Thread(
            target=self._start,
            args=(SubprocessASGIServer(), None if seeded else files),
            name="prefect-temporary-server",
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _start(server, new_database: _DatabaseFiles | None) -> None:
        try:
            server.start()
            if new_database is not None:
                new_database.save()
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


@dataclass(frozen=True)
class _DatabaseFiles:
    """This home's Prefect database and block-registration memo, and their templates.

    Read from the settings in the calling thread: Prefect's settings context does not follow
    into the thread that starts the server.
    """

    database: Path
    memo: Path
    version: str

    @classmethod
    def of_current_settings(cls) -> _DatabaseFiles | None:
        """None where the database is not Prefect's default kind (sqlite)."""
        import prefect
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        url = settings.server.database.connection_url
        url = url.get_secret_value() if url is not None else ""
        prefix = "sqlite+aiosqlite:///"
        if not url.startswith(prefix):
            return None
        return cls(
            Path(url.removeprefix(prefix)), settings.server.memo_store_path, prefect.__version__
        )

    @property
    def memo_template(self) -> Path:
        # The memo travels with the database that holds the blocks it remembers.
        return db_templates.template_path("prefect", self.version).with_suffix(".memo_store.toml")

    def seed(self) -> bool:
        """A fresh home's database (and memo) from the template: no migrations to run."""
        if not db_templates.seed(self.database, "prefect", self.version, None):
            return False
        if self.memo_template.is_file() and not self.memo.exists():
            shutil.copyfile(self.memo_template, self.memo)
        return True

    def save(self) -> None:
        """Keep the just-migrated database (and memo) as the template of later homes."""
        if db_templates.template_path("prefect", self.version).exists():
            return
        if self.memo.is_file():
            self.memo_template.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.memo, self.memo_template)
        db_templates.save(self.database, "prefect", self.version)
