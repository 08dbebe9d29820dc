"""Process environment for the CLI, set before prefect or ray are imported."""

from __future__ import annotations

import os
from pathlib import Path

from training.errors import ServiceUnreachableError
from training.platform.probe import health_url, http_problem
from training.storage import trainflow_home

PREFECT_API_ENV = "PREFECT_API_URL"
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
PREFECT_HEALTH_TIMEOUT_S = 5.0


def prepare_environment(use_stack: bool = True, tracking_uri_configured: bool = False) -> None:
    """Keep Prefect's state under the trainflow home and every service quiet and offline.

    While `trainflow up`'s stack runs, point Prefect and MLflow at its servers. Only defaults:
    anything the user exported wins, and so does a configured ``mlflow.tracking_uri``.
    """
    home = trainflow_home()
    home.mkdir(parents=True, exist_ok=True)
    from deployments.stack import service_environment

    for key, value in service_environment(home).items():
        os.environ.setdefault(key, value)
    if use_stack:
        urls = stack_urls(home)
        if urls is not None:
            os.environ.setdefault(PREFECT_API_ENV, urls[0])
            if not tracking_uri_configured:
                os.environ.setdefault(MLFLOW_URI_ENV, urls[1])


def stack_urls(home: Path | None = None) -> tuple[str, str] | None:
    """(Prefect API URL, MLflow URL) of the stack `trainflow up` started, if it still runs."""
    from deployments.stack_state import running_state

    state = running_state(home)
    if state is None:
        return None
    return state.prefect_api_url, state.mlflow_url


def check_prefect_api(timeout: float = PREFECT_HEALTH_TIMEOUT_S) -> None:
    """With ``PREFECT_API_URL`` set, fail at once (not after Prefect's client retries) if the
    server does not answer, naming the URL and the fix."""
    url = os.environ.get(PREFECT_API_ENV)
    if not url:
        return
    reason = http_problem(health_url(url), timeout)
    if reason is None:
        return
    raise ServiceUnreachableError(
        f"Prefect API {url} is not reachable ({reason}); start the stack with `trainflow up`, "
        f"or unset {PREFECT_API_ENV} to run with a temporary local Prefect server"
    )
