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
from pathlib import Path

from training import db_templates

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
        database = _sqlite_database()
        seeded = database is not None and _seed_database(database)
        self._thread = threading.Thread(
            target=self._start,
            args=(SubprocessASGIServer(), None if seeded else database),
            name="prefect-temporary-server",
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _start(server, new_database: Path | None) -> None:
        try:
            server.start()
            if new_database is not None:
                _save_database(new_database)
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


def _sqlite_database() -> Path | None:
    """The server's database file, where it is Prefect's default kind (sqlite)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    url = url.get_secret_value() if url is not None else ""
    prefix = "sqlite+aiosqlite:///"
    return Path(url.removeprefix(prefix)) if url.startswith(prefix) else None


def _template_files() -> tuple[Path, Path, Path]:
    """(template, memo template, this home's memo): Prefect's memo of its block registration
    travels with the database that holds those blocks."""
    import prefect
    from prefect.settings import get_current_settings

    template = db_templates.template_path("prefect", prefect.__version__)
    memo = get_current_settings().server.memo_store_path
    return template, template.with_suffix(".memo_store.toml"), memo


def _seed_database(database: Path) -> bool:
    """A fresh home's database (and block memo) from the template: no migrations to run."""
    import prefect

    if not db_templates.seed(database, "prefect", prefect.__version__, None):
        return False
    _, memo_template, memo = _template_files()
    if memo_template.is_file() and not memo.exists():
        shutil.copyfile(memo_template, memo)
    return True


def _save_database(database: Path) -> None:
    """Keep the just-migrated database (and block memo) as the template of later homes."""
    import prefect

    template, memo_template, memo = _template_files()
    if template.exists():
        return
    if memo.is_file():
        memo_template.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(memo, memo_template)
    db_templates.save(database, "prefect", prefect.__version__)
