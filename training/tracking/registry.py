"""Models in the registry: logged with their weights file, registered as versions, described,
found again by URI, and promoted (the champion alias moved as the gate decides).

Registered versions carry the gate's decision as ``gate.*`` tags and two aliases:
``challenger`` (the latest candidate) and ``champion`` (the model in use). The model's weights
file (our own ``state_path``, read back with ``torch.load(weights_only=True)``) is stored inside
the MLflow model as ``<model artifacts>/extra_files/<file name>``; :func:`model_files` returns
its local path for any ``models:/`` or ``runs:/`` URI.
"""

from __future__ import annotations

import copy
import importlib.metadata
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import ModelNotFoundError, one_line
from training.secrets import redact
from training.tracking import gate, ui
from training.tracking.lock import registry_lock
from training.tracking.runs import Tracker, filter_literal, tag_values
from training.tracking.store import global_uris

if TYPE_CHECKING:
    import numpy as np
    import torch

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
STATE_DIR_IN_MODEL = "extra_files"  # where mlflow puts extra_files inside the model artifacts


def log_and_register_model(
    tracker: Tracker,
    run_id: str,
    model: torch.nn.Module,
    input_example: np.ndarray,
    state_path: str,
    description: str,
    tags: dict[str, Any] | None = None,
    reuse_existing: bool = True,
) -> dict[str, str]:
    """Log ``model`` as an MLflow model under ``run_id`` and register a new version.

    ``input_example`` needs a batch of more than one row (torch.export makes a batch dimension
    of size 1 static). ``state_path`` (our checkpoint file) is stored in the model as
    ``extra_files/<file name>``; :func:`model_files` finds it again.

    With ``reuse_existing`` a version already registered from ``run_id`` (a retried task) is
    returned instead of registering a duplicate.
    """
    import mlflow
    import mlflow.pytorch

    name = tracker.config.mlflow.registered_model
    state_file = f"{STATE_DIR_IN_MODEL}/{os.path.basename(state_path)}"
    existing = version_of_run(tracker, name, run_id) if reuse_existing else None
    if existing is not None:
        log.info(
            "model version %s of %s already registered from run %s", existing.version, name, run_id
        )
        version, logged_uri = str(existing.version), existing.source
    else:
        model = copy.deepcopy(model).cpu().eval()
        example, signature = _example_and_signature(model, input_example)
        was_running = tracker.client.get_run(run_id).info.status == "RUNNING"
        try:
            # The fluent API reads the process-wide URIs.
            with global_uris(tracker.tracking_uri), mlflow.start_run(run_id=run_id):
                info = mlflow.pytorch.log_model(
                    model,
                    name="model",
                    signature=signature,
                    input_example=example,
                    extra_files=[str(state_path)],
                    # Given, not inferred: inference loads the model in a subprocess (~5 s) and
                    # lists every package the process happens to import.
                    pip_requirements=_model_requirements(),
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
        "state_file": state_file,
    }


def _example_and_signature(model: torch.nn.Module, input_example: np.ndarray) -> tuple:
    """The input example in the model's float dtype, and the signature of its output."""
    import numpy as np
    import torch
    from mlflow.models import infer_signature

    param = next(model.parameters(), None)
    example = np.asarray(input_example)
    if (
        param is not None
        and param.is_floating_point()
        and np.issubdtype(example.dtype, np.floating)
    ):
        example = example.astype(torch.empty((), dtype=param.dtype).numpy().dtype)
    with torch.no_grad():
        output = model(torch.from_numpy(example)).numpy()
    return example, infer_signature(example, output)


def _model_requirements() -> list[str]:
    """What loading the model (torch.export's pt2 format through mlflow.pyfunc) needs."""
    requirements = []
    for package in ("mlflow", "torch", "numpy"):
        try:
            version = importlib.metadata.version(package).split("+")[0]  # drop "+cpu"
        except importlib.metadata.PackageNotFoundError:
            continue
        requirements.append(f"{package}=={version}")
    return requirements


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
    name = tracker.config.mlflow.registered_model
    if version is None:
        tracker.client.update_registered_model(name, description=description)
    else:
        tracker.client.update_model_version(name, str(version), description=description)


def model_files(tracker: Tracker, model_uri: str, dst_path: str | None = None) -> Path:
    """The local path of our state file inside the model at ``model_uri``
    (``models:/name@alias``, ``models:/name/version``, ``models:/m-...`` or ``runs:/...``)."""
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    uri = tracker.tracking_uri
    # models:/ URIs resolve through the process-wide registry URI, whatever is passed below.
    try:
        with global_uris(uri):
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=model_uri, dst_path=dst_path, tracking_uri=uri, registry_uri=uri
            )
        flavor = Model.load(local).flavors.get("pytorch", {})
    except (MlflowException, OSError) as exc:
        reason = one_line(redact(str(exc))) or type(exc).__name__
        raise ModelNotFoundError(
            f"model {model_uri!r} was not found in the MLflow store {redact(uri)} ({reason}); "
            f"see the registered models in the MLflow UI (`{ui.command(tracker)}`) or use "
            f"models:/{tracker.config.mlflow.registered_model}@{CHAMPION}"
        ) from None
    extra = [entry["path"] for entry in flavor.get("extra_files", [])]
    if not extra:
        raise ModelNotFoundError(
            f"model {model_uri!r} has no trainflow state file (extra_files); it was not logged "
            "by trainflow — pass a model registered by `trainflow run`"
        )
    return Path(local) / extra[0]


def promote(tracker: Tracker, version: str, challenger_value: float) -> dict[str, Any]:
    """Alias ``challenger`` to ``version``; move ``champion`` to it only if it wins the gate
    (:func:`training.tracking.gate.decide`, on ``mlflow.gate``'s metric and min_delta)."""
    client = tracker.client
    name = tracker.config.mlflow.registered_model
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
