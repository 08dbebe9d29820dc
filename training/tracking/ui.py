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
# MLflow 3's UI opens an experiment on its GenAI side (traces) unless the link asks for the
# "Model training" side, whatever the experiment's kind tag says; a browser only remembers the
# switch once a user has flipped it.
TRAINING_VIEW = "workflowType=machine_learning"


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


def runs_url(tracker: Tracker) -> str:
    """The experiment's runs table in the training view (for a local store: once
    :func:`command` runs)."""
    return f"{base_url(tracker)}/#/experiments/{tracker.experiment_id}/runs?{TRAINING_VIEW}"


def run_page_url(tracker: Tracker, run_id: str) -> str:
    """The run's page in the training view (for a local store: once :func:`command` runs)."""
    return f"{_run_path(tracker, run_id)}?{TRAINING_VIEW}"


def run_url(tracker: Tracker, run_id: str) -> str | None:
    """The run's page on the tracking server, in the training view; None for a local store."""
    if not is_http(tracker.tracking_uri):
        return None
    return run_page_url(tracker, run_id)


def _run_path(tracker: Tracker, run_id: str) -> str:
    return f"{base_url(tracker)}/#/experiments/{tracker.experiment_id}/runs/{run_id}"


def model_version_url(tracker: Tracker, name: str, version: str | int) -> str:
    """The registered model version's page."""
    quoted = urllib.parse.quote(name, safe="")
    return f"{base_url(tracker)}/#/models/{quoted}/versions/{version}"


def how_to_open(tracker: Tracker, url: str) -> str:
    """``url`` for a tracking server; for a local store, the command that starts the UI first."""
    if is_http(tracker.tracking_uri):
        return url
    return f"start the UI with `{command(tracker)}`, then open {url}"


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
    if is_http(tracker.tracking_uri):
        return f"{_run_path(tracker, run_id)}/artifactPath/{path}"
    return f"{tracker.client.get_run(run_id).info.artifact_uri.rstrip('/')}/{path}"
