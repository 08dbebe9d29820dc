"""Our errors in Prefect's run logs: the message, without a traceback.

Prefect logs a failed task or flow with ``exc_info``, so the flow run's logs (UI, API, console)
show a stack trace even for a missing column. trainflow's own errors already say what is wrong
and how to fix it; their traceback only hides that. Any other exception (a bug) keeps it.
"""

from __future__ import annotations

import logging

from training.errors import TrainflowError

# The loggers Prefect's engines log run failures on.
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class DropTracebackOfOurErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, TrainflowError):
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = DropTracebackOfOurErrors()


def install() -> None:
    """Idempotent: a filter on each of Prefect's run loggers."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
