"""Where a user looks at tracked runs: the MLflow UI's addresses, and the command that starts it."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable

from training.platform.secrets import without_userinfo
from training.tracking.runs import Tracker
from training.tracking.store import is_http

# Where `mlflow ui` (see :func:`command`) serves a local store.
LOCAL_UI_URL = "http://127.0.0.1:5000"


def command(tracker: Tracker) -> str:
    """The shell command (or URL) that shows the tracker's runs in the MLflow UI."""
    if is_http(tracker.tracking_uri):
        return without_userinfo(tracker.tracking_uri)
    return f"mlflow ui --backend-store-uri {tracker.tracking_uri} --host 127.0.0.1 --port 5000"


def base_url(tracker: Tracker) -> str:
    """The MLflow UI's address: the tracking server, or where `mlflow ui` serves."""
    if is_http(tracker.tracking_uri):
        return without_userinfo(tracker.tracking_uri)
    return LOCAL_UI_URL


def run_url(tracker: Tracker, run_id: str) -> str | None:
    """The run's page on the tracking server; None for a local store."""
    if not is_http(tracker.tracking_uri):
        return None
    return f"{base_url(tracker)}/#/experiments/{tracker.experiment_id}/runs/{run_id}"


def compare_url(
    tracker: Tracker, run_ids: Iterable[str], experiment_ids: Iterable[str] = ()
) -> str:
    """The MLflow UI's compare view of ``run_ids`` (under :func:`base_url`)."""
    runs = urllib.parse.quote(json.dumps(list(run_ids), separators=(",", ":")), safe="")
    experiments = list(experiment_ids) or [tracker.experiment_id]
    exps = urllib.parse.quote(json.dumps(experiments, separators=(",", ":")), safe="")
    return f"{base_url(tracker)}/#/compare-runs?runs={runs}&experiments={exps}"


def artifact_url(tracker: Tracker, run_id: str, path: str) -> str:
    """Where a user opens a run's artifact: its page in the UI of a tracking server, else
    its location in the artifact store (a file:// URI for a local store)."""
    url = run_url(tracker, run_id)
    if url is not None:
        return f"{url}/artifactPath/{path}"
    return f"{tracker.client.get_run(run_id).info.artifact_uri.rstrip('/')}/{path}"
