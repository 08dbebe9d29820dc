"""Progress events: what a stage has done so far, as log records that the console renders.

Stages report through the standard ``logging`` module (``training/`` never imports prefect or
rich): the CLI's progress view listens on :data:`LOGGER`, the run's log file keeps every event,
and Prefect forwards the logger to the flow run's logs in its UI
(``PREFECT_LOGGING_EXTRA_LOGGERS``).
"""

from __future__ import annotations

import logging
from typing import Any

LOGGER = "trainflow.progress"
# The attribute of a log record that carries the event's fields.
FIELDS = "trainflow_progress"


def report(stage: str, message: str, **fields: Any) -> None:
    """One event of ``stage``: a readable ``message`` and the numbers behind it."""
    logging.getLogger(LOGGER).info(
        "%s: %s", stage, message, extra={FIELDS: {"stage": stage, **fields}}
    )


def fields_of(record: logging.LogRecord) -> dict[str, Any] | None:
    """The event's fields, or None for a record that is not a progress event."""
    return getattr(record, FIELDS, None)


class Every:
    """True at most once per ``seconds`` (and on the first call): for events of a long loop."""

    def __init__(self, seconds: float) -> None:
        import time

        self._clock = time.monotonic
        self._seconds = seconds
        self._next = 0.0

    def due(self) -> bool:
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._seconds
        return True
