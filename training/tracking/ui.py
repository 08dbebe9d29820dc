"""Where a user looks at tracked runs: the MLflow UI's addresses, and the command that starts it."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable

from training.platform.secrets import without_userinfo
from training.tracking.runs import STAGE_TAG, Tracker
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
    return experiment_runs_url(base_url(tracker), tracker.experiment_id)


def experiment_runs_url(ui_base: str, experiment_id: str) -> str:
    return f"{ui_base.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"


def training_experiments(tracking_uri: str, limit: int = 20) -> dict[str, str]:
    """The model-training experiments of a tracking server (those trainflow created carry the
    kind tag), name -> their runs table in the training view; newest first."""
    from mlflow import MlflowClient

    from training.tracking.store import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND

    found = MlflowClient(tracking_uri).search_experiments(
        filter_string=f"tags.`{EXPERIMENT_KIND_TAG}` = '{MODEL_TRAINING_KIND}'",
        max_results=limit,
        order_by=["last_update_time DESC"],
    )
    base = without_userinfo(tracking_uri)
    return {e.name: experiment_runs_url(base, e.experiment_id) for e in found}


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


def run_tree_links(
    tracker: Tracker, parent: str, model_name: str | None = None, version: str | None = None
) -> dict[str, str]:
    """Label -> page of what a pipeline run produced: the runs table, the best trial, the train
    and evaluate runs (training view) and the model version (a local store: once :func:`command`
    runs)."""
    stages = {run.data.tags.get(STAGE_TAG): run for run in tracker.find_runs(parent)}
    links = {"the pipeline's runs": runs_url(tracker)}
    sweep = stages.get("sweep")
    best = sweep.data.tags.get("best_trial_run_id") if sweep else None
    if best and best != "none":
        links[f"best trial ({sweep.data.tags.get('best_trial_name', best)})"] = run_page_url(
            tracker, best
        )
    for stage in ("train", "evaluate"):
        if stage in stages:
            links[f"{stage} run"] = run_page_url(tracker, stages[stage].info.run_id)
    if model_name and version:
        links[f"model {model_name} version {version}"] = model_version_url(
            tracker, model_name, version
        )
    return links
