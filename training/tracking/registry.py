"""Models in the registry: logged as pyfunc models (training.tracking.pyfunc), registered as
versions, described, found again by URI, and promoted (the champion alias moved as the gate
decides).

Registered versions carry the gate's decision as ``gate.*`` tags and two aliases:
``challenger`` (the latest candidate) and ``champion`` (the model in use). The model's state
file (weights, feature spec, label map; read back with ``torch.load(weights_only=True)``) is the
pyfunc's one artifact, ``<model>/artifacts/state.pt``; :func:`model_files` returns its local
path for any ``models:/`` or ``runs:/`` URI, :func:`download_model` the model's directory.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.config import registered_model_name
from training.errors import ModelNotFoundError, one_line
from training.platform.secrets import redact
from training.tracking import gate, pyfunc, ui
from training.tracking.lock import registry_lock
from training.tracking.runs import Tracker, filter_literal, tag_values
from training.tracking.store import global_uris

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"


def log_and_register_model(
    tracker: Tracker,
    run_id: str,
    state_path: str,
    raw_rows: pd.DataFrame | None,
    description: str,
    tags: dict[str, Any] | None = None,
    reuse_existing: bool = True,
) -> dict[str, str]:
    """Log the trainflow state at ``state_path`` as a pyfunc model under ``run_id`` and register
    a new version (:mod:`training.tracking.pyfunc`: raw table in, labels and probabilities out).

    ``raw_rows`` (a few rows of the user's table) give the signature its column types and the
    model its input example. The state file is stored as ``artifacts/state.pt``;
    :func:`model_files` finds it again.

    With ``reuse_existing`` a version already registered from ``run_id`` (a retried task) is
    returned instead of registering a duplicate.
    """
    import mlflow
    import mlflow.pyfunc
    import torch

    name = registered_model_name(tracker.config)
    existing = version_of_run(tracker, name, run_id) if reuse_existing else None
    if existing is not None:
        log.info(
            "model version %s of %s already registered from run %s", existing.version, name, run_id
        )
        version, logged_uri = str(existing.version), existing.source
    else:
        spec = torch.load(state_path, map_location="cpu", weights_only=True)["spec"]
        was_running = tracker.client.get_run(run_id).info.status == "RUNNING"
        try:
            # The fluent API reads the process-wide URIs.
            with (
                tempfile.TemporaryDirectory() as tmp,
                global_uris(tracker.tracking_uri),
                mlflow.start_run(run_id=run_id),
            ):
                info = mlflow.pyfunc.log_model(
                    name="model", **pyfunc.model_kwargs(state_path, spec, raw_rows, tmp)
                )
        finally:
            if was_running:  # leaving the `with` ended the run; ending it is the caller's job
                tracker.client.update_run(run_id, status="RUNNING")
        with global_uris(tracker.tracking_uri):
            registered = mlflow.register_model(
                info.model_uri, name, tags=tag_values(tags or {}) or None
            )
        version, logged_uri = str(registered.version), info.model_uri
        tracker.client.update_model_version(name, version, description=description)
    return {
        "name": name,
        "version": version,
        "model_uri": f"models:/{name}/{version}",
        "logged_model_uri": logged_uri,
        "source_run_id": run_id,
        "state_file": pyfunc.STATE_FILE_IN_MODEL,
    }


def version_of_run(tracker: Tracker, name: str, run_id: str):
    """The oldest version of registered model ``name`` registered from ``run_id``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        versions = tracker.client.search_model_versions(
            f"name = {filter_literal(name)} and run_id = {filter_literal(run_id)}"
        )
    except MlflowException as exc:
        log.debug("no versions of %s from run %s: %s", name, run_id, exc)
        return None
    return min(versions, key=lambda v: int(v.version)) if versions else None


def describe_model(tracker: Tracker, description: str, version: str | None = None) -> None:
    """Set the description of the registered model, or of one of its versions."""
    name = registered_model_name(tracker.config)
    if version is None:
        tracker.client.update_registered_model(name, description=description)
    else:
        tracker.client.update_model_version(name, str(version), description=description)


def download_model(tracker: Tracker, model_uri: str, dst_path: str | None = None) -> Path:
    """The local directory of the MLflow model at ``model_uri`` (``models:/name@alias``,
    ``models:/name/version``, ``models:/m-...`` or ``runs:/...``)."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    uri = tracker.tracking_uri
    # models:/ URIs resolve through the process-wide registry URI, whatever is passed below.
    try:
        with global_uris(uri):
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=model_uri, dst_path=dst_path, tracking_uri=uri, registry_uri=uri
            )
    except (MlflowException, OSError) as exc:
        reason = one_line(redact(str(exc))) or type(exc).__name__
        raise ModelNotFoundError(
            f"model {model_uri!r} was not found in the MLflow store {redact(uri)} ({reason}); "
            f"see the registered models in the MLflow UI (`{ui.command(tracker)}`) or use "
            f"models:/{registered_model_name(tracker.config)}@{CHAMPION}"
        ) from None
    return Path(local)


def model_files(tracker: Tracker, model_uri: str, dst_path: str | None = None) -> Path:
    """The local path of our state file inside the model at ``model_uri``."""
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    local = download_model(tracker, model_uri, dst_path)
    try:
        flavor = Model.load(local).flavors.get("python_function", {})
    except (MlflowException, OSError):
        flavor = {}
    state = flavor.get("artifacts", {}).get(pyfunc.STATE_ARTIFACT, {}).get("path")
    if not state or not (local / state).is_file():
        raise ModelNotFoundError(
            f"model {model_uri!r} has no trainflow state file ({pyfunc.STATE_FILE_IN_MODEL}); "
            "it was not logged by trainflow — pass a model registered by `trainflow run`"
        )
    return local / state


def promote(tracker: Tracker, version: str, challenger_value: float) -> dict[str, Any]:
    """Alias ``challenger`` to ``version``; move ``champion`` to it only if it wins the gate
    (:func:`training.tracking.gate.decide`, on ``mlflow.gate``'s metric and min_delta)."""
    client = tracker.client
    name = registered_model_name(tracker.config)
    metric, min_delta = tracker.config.mlflow.gate.metric, tracker.config.mlflow.gate.min_delta
    version, challenger_value = str(version), float(challenger_value)
    # Read the champion, compare and move the aliases as one step: two runs promoting at
    # once must not both read the old champion and the worse one write last.
    with registry_lock(client, name):
        client.set_registered_model_alias(name, CHALLENGER, version)
        champion = _champion(tracker, name)
        decision = gate.decide(metric, min_delta, version, challenger_value, champion)
        if decision.takes_champion:
            client.set_registered_model_alias(name, CHAMPION, version)
        if not decision.repeated:
            for key, value in gate.version_tags(metric, challenger_value, decision).items():
                client.set_model_version_tag(name, version, key, value)
        aliases = list(client.get_model_version(name, version).aliases)
    return {
        "decision": decision.decision,
        "champion_version": version if decision.takes_champion else decision.previous,
        "challenger_version": version,
        "challenger_value": challenger_value,
        "champion_value": decision.champion_value,
        "aliases": sorted(aliases),
    }


def _champion(tracker: Tracker, name: str) -> gate.Champion | None:
    """The version aliased champion, as the gate reads it; None when there is none yet."""
    from mlflow.exceptions import MlflowException

    try:
        found = tracker.client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST" and "not found" not in str(exc).lower():
            raise
        return None
    return gate.Champion(str(found.version), dict(found.tags))
