"""A Prefect server that stopped answering during a run and never came back: one clear error.

Prefect's client rides out an outage on its own: every request that fails to connect (once the
client has connected) is tried again after 2, 4, 8, ... s, ±20 % (``PREFECT_CLIENT_MAX_RETRIES``
tries, set by trainflow in ``deployments.stack.service_environment``); task states travel as
events that its websocket client keeps and sends again once the server answers. Past the last
try the flow's call raises httpx's connection error, and the flow engine's own attempt to report
the failure waits as long again. This module names that error for the user: the server, how
long the client waited, what to do; and ends the waiting for the rest of the process, whose exit
would otherwise spend the whole budget again on each log batch still queued.
"""

from __future__ import annotations

import os

from trainflow.env import PREFECT_API_ENV
from training.errors import TrainflowError


class PrefectUnavailableError(TrainflowError):
    """The Prefect server stopped answering during a run and did not come back within the
    client's retries: the run stops (exit 1) and can be resumed."""


def retry_budget_s(max_retries: int) -> int:
    """Seconds Prefect's client waits in all before giving up on one request (before jitter):
    2**n after the n-th failed try (``prefect/client/base.py``, ``_send_with_retry``)."""
    return 2 ** (max_retries + 1) - 2


def _client_max_retries() -> int:
    from prefect.settings import get_current_settings

    return get_current_settings().client.max_retries


def _failed_request_url(exc: BaseException) -> str | None:
    """The URL of the request behind an httpx transport error (connect, read, write, timeout)
    anywhere in ``exc``'s chain; None if there is none."""
    import httpx

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, httpx.TransportError):
            try:
                return str(exc.request.url)
            except RuntimeError:  # an error raised without its request
                return None
        exc = exc.__cause__ or exc.__context__
    return None


def explained(exc: BaseException, run_id: str | None) -> PrefectUnavailableError | None:
    """``PrefectUnavailableError`` when ``exc`` is the Prefect API of ``PREFECT_API_URL`` not
    answering; otherwise None."""
    api_url = os.environ.get(PREFECT_API_ENV, "").rstrip("/")
    failed = _failed_request_url(exc)
    if not api_url or failed is None or not failed.startswith(api_url):
        return None
    retries = _client_max_retries()
    again = f"`trainflow run --resume {run_id}`" if run_id else "`trainflow run --resume RUN_ID`"
    return PrefectUnavailableError(
        f"Prefect API {api_url} stopped answering during the run and did not come back while "
        f"Prefect's client retried ({retries} retries over ~{retry_budget_s(retries)} s; "
        f"PREFECT_CLIENT_MAX_RETRIES). Start the server again "
        f"(`trainflow up` for the local stack), then resume with {again}"
    )


def stop_waiting() -> None:
    """No more retries in this process: the server was waited for once already. Prefect's
    background workers (log batches, events) read the setting at each try from the
    process-global settings, refreshed here from the environment."""
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = "0"
    refresh_global_settings_context()
