"""Retry policy shared by every stage task: back off, but never retry what cannot succeed."""

from __future__ import annotations

from prefect.tasks import exponential_backoff

from training.errors import is_retriable

RETRIES = 2
RETRY_DELAYS = exponential_backoff(backoff_factor=5)  # 5 s, 10 s
RETRY_JITTER = 0.2


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Prefect's retry_condition_fn: ConfigError/DataValidationError end the task at once."""
    exc = getattr(state, "data", None)
    if isinstance(exc, BaseException):
        return is_retriable(exc)
    try:
        state.result()
    except Exception as raised:  # the state's own exception, re-raised by Prefect
        return is_retriable(raised)
    return True


STAGE_TASK_OPTIONS = {
    "retries": RETRIES,
    "retry_delay_seconds": RETRY_DELAYS,
    "retry_jitter_factor": RETRY_JITTER,
    "retry_condition_fn": retry_unless_bad_input,
}
