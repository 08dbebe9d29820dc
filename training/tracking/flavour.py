"""trainflow's model flavour, shaped like MLflow's own flavour modules (``mlflow.pytorch``):
:func:`save_model`, :func:`log_model` (logged and registered as a version), :func:`load_model`
and :func:`predict`, and the ways a user names a model (:func:`resolve`).

The model is an MLflow pyfunc logged as code: a short entry script that sets the shipped class
(:data:`MODEL_CLASS` of ``trainflow_pyfunc.model``) as the model, that package as
``code_paths`` (torch, numpy, pandas, mlflow only), and the trainflow state file (weights,
feature spec, model config) as its one artifact, ``artifacts/state.pt``. Nothing is pickled, so
the model loads where trainflow is not installed, and every consumer (``trainflow predict`` and
``evaluate``, the evaluate stage, an MLflow client, ``mlflow models serve``) runs the same code.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.config import registered_model_name
from training.errors import DataValidationError, ModelNotFoundError, one_line
from training.model import trainflow_pyfunc
from training.model.trainflow_pyfunc.model import PREDICTION, STATE_ARTIFACT, class_columns
from training.platform.secrets import redact
from training.tracking import model_files, registry, ui
from training.tracking.runs import Tracker, tag_values
from training.tracking.servable import servable_state_file, tokenizer_file
from training.tracking.signature import EXAMPLE_ROWS, input_example, signature
from training.tracking.store import global_uris

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn

    from training.config import PipelineConfig
    from training.manifest import FeatureSpec

__all__ = [
    "EXAMPLE_ROWS",
    "PREDICTION",
    "class_columns",
    "load_model",
    "log_model",
    "predict",
    "resolve",
    "save_model",
]

log = logging.getLogger(__name__)

#: The class the registered model runs, in ``trainflow_pyfunc.model``: named here only.
MODEL_CLASS = "TrainflowModel"
#: The package shipped with the model; inside the model it is the top-level ``trainflow_pyfunc``.
CODE_DIR = Path(trainflow_pyfunc.__file__).parent
#: The state file's name inside the model.
STATE_FILE_IN_MODEL = "artifacts/state.pt"
_ENTRY = f'''"""trainflow's model, logged as code (see trainflow_pyfunc.model)."""
import mlflow

try:  # the copy shipped with the model (its code_paths)
    from trainflow_pyfunc.model import {MODEL_CLASS} as Model
except ModuleNotFoundError:  # only while trainflow saves the model
    from training.model.trainflow_pyfunc.model import {MODEL_CLASS} as Model

mlflow.models.set_model(Model())
'''


@dataclass(frozen=True)
class RegisteredVersion:
    """A logged model's registered version, and where its files are."""

    name: str
    version: str
    model_uri: str  # models:/NAME/VERSION
    logged_model_uri: str  # the logged model itself (models:/m-...)
    source_run_id: str
    state_file: str  # the state file inside the model

    @property
    def model_id(self) -> str:
        """The logged model's id (``m-...``)."""
        return self.logged_model_uri.removeprefix("models:/")


@dataclass(frozen=True)
class PackedModel:
    """A model's files by relative path (they travel to Ray workers on any node) and its
    classes (none: a regression)."""

    files: dict[str, bytes]
    classes: list[Any]


def requirements(
    spec: dict[str, Any] | None = None, text_model: bool = False, lightning: bool = False
) -> list[str]:
    """What loading the model needs, pinned to this environment's versions (Pillow for a model
    of images: it decodes encoded ones; transformers and tokenizers for a Hugging Face text
    model; Lightning for a LightningModule, which the model rebuilds from its factory)."""
    pins = []
    images = ("pillow",) if spec and spec.get("image_column") else ()
    text = ("transformers", "tokenizers") if text_model else ()
    if ((spec or {}).get("tokens") or {}).get("chat_template"):
        text += ("jinja2",)  # transformers renders a chat template with it
    modules = ("lightning",) if lightning else ()
    for package in ("mlflow", "torch", "pandas", "numpy", *images, *text, *modules):
        try:
            version = importlib.metadata.version(package).split("+")[0]  # drop "+cpu"
        except importlib.metadata.PackageNotFoundError:
            continue
        pins.append(f"{package}=={version}")
    return pins


def model_kwargs(state_path: str, spec: dict[str, Any], raw_rows: pd.DataFrame | None, tmp: str):
    """The keyword arguments of ``mlflow.pyfunc.save_model``/``log_model`` for a state file.

    A custom model (``model.kind: custom``) carries its factory's package too, so the model
    rebuilds the user's network where neither trainflow nor the user's project is installed.
    """
    from training.model import factory

    state_path, model_config = servable_state_file(state_path, tmp)
    artifacts = {STATE_ARTIFACT: str(state_path), **tokenizer_file(spec, tmp)}
    entry = os.path.join(tmp, "trainflow_model.py")
    Path(entry).write_text(_ENTRY)
    example = input_example(spec, raw_rows) if raw_rows is not None else None
    return {
        "python_model": entry,
        "code_paths": [str(CODE_DIR), *factory.code_paths(model_config)],
        "artifacts": artifacts,
        "signature": signature(spec, example),
        "input_example": example,
        "pip_requirements": requirements(
            spec, model_config.get("kind") == "hf", model_config.get("engine") == "lightning"
        )
        + factory.requirements(model_config),
        # A key MLflow lets a loader override: load_model(uri, model_config={"device": "cpu"}).
        "model_config": {"device": None},
    }


def save_model(state: dict[str, Any], path: str, raw_rows: pd.DataFrame | None = None) -> str:
    """Save a trainflow state (weights, spec, model config) as a model directory."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        state_path = os.path.join(tmp, "state.pt")
        torch.save({k: v for k, v in state.items() if k != "optimizer"}, state_path)
        model_files.save_model(path, **model_kwargs(state_path, state["spec"], raw_rows, tmp))
    return path


def log_model(
    tracker: Tracker,
    run_id: str,
    state_path: str,
    raw_rows: pd.DataFrame | None,
    description: str,
    tags: dict[str, Any] | None = None,
    reuse_existing: bool = True,
    logged_model_uri: str | None = None,
) -> RegisteredVersion:
    """Log the state at ``state_path`` as a model under ``run_id`` and register a new version
    of ``mlflow.registered_model``; with ``logged_model_uri`` (the checkpoint's logged model,
    ``checkpoint_models``) register that one instead of logging the state again.

    ``raw_rows`` (a few rows of the user's table) give the signature its column types and the
    model its input example. With ``reuse_existing`` a version already registered from
    ``run_id`` (a retried task) is returned instead of registering a duplicate.
    """
    import mlflow

    name = registered_model_name(tracker.config)
    existing = registry.version_of_run(tracker, name, run_id) if reuse_existing else None
    if existing is not None:
        log.info(
            "model version %s of %s already registered from run %s", existing.version, name, run_id
        )
        version, logged_uri = str(existing.version), existing.source
    else:
        logged_uri = logged_model_uri or _log_new(tracker, run_id, name, state_path, raw_rows)
        with global_uris(tracker.tracking_uri):
            registered = mlflow.register_model(
                logged_uri, name, tags=tag_values(tags or {}) or None
            )
        version = str(registered.version)
        tracker.client.update_model_version(name, version, description=description)
    return RegisteredVersion(
        name, version, f"models:/{name}/{version}", logged_uri, run_id, STATE_FILE_IN_MODEL
    )


def _log_new(
    tracker: Tracker, run_id: str, name: str, state_path: str, raw_rows: pd.DataFrame | None
) -> str:
    """Log the state at ``state_path`` as a model called ``name`` under ``run_id``; its URI."""
    import mlflow
    import torch

    spec = torch.load(state_path, map_location="cpu", weights_only=True)["spec"]
    was_running = tracker.client.get_run(run_id).info.status == "RUNNING"
    try:
        # The fluent API reads the process-wide URIs.
        with (
            tempfile.TemporaryDirectory() as tmp,
            global_uris(tracker.tracking_uri),
            mlflow.start_run(run_id=run_id),
        ):
            # Named after the registered model: the MLflow UI lists logged models by name.
            info = model_files.log_model(name, **model_kwargs(state_path, spec, raw_rows, tmp))
    finally:
        if was_running:  # leaving the `with` ended the run; ending it is the caller's job
            tracker.client.update_run(run_id, status="RUNNING")
    return info.model_uri


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
            f"models:/{registered_model_name(tracker.config)}@{registry.CHAMPION}"
        ) from None
    return Path(local)


def state_file(tracker: Tracker, model_uri: str, dst_path: str | None = None) -> Path:
    """The local path of our state file inside the model at ``model_uri``."""
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    local = download_model(tracker, model_uri, dst_path)
    try:
        flavor = Model.load(local).flavors.get("python_function", {})
    except (MlflowException, OSError):
        flavor = {}
    state = flavor.get("artifacts", {}).get(STATE_ARTIFACT, {}).get("path")
    if not state or not (local / state).is_file():
        raise ModelNotFoundError(
            f"model {model_uri!r} has no trainflow state file ({STATE_FILE_IN_MODEL}); "
            "it was not logged by trainflow — pass a model registered by `trainflow run`"
        )
    return local / state


def pack(model_dir: str) -> dict[str, bytes]:
    """A model directory's files by relative path: they travel to Ray workers on any node."""
    root = Path(model_dir)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def resolve(config: PipelineConfig, model_uri: str) -> PackedModel:
    """The model a user names: a ``models:/`` or ``runs:/`` URI's own files, or a checkpoint
    directory saved as the same model."""
    from training.loop.checkpoint import load_model_state
    from training.tracking import store

    local = Path(model_uri)
    with tempfile.TemporaryDirectory() as tmp:
        if local.exists():
            state = load_model_state(str(local))  # weights_only: refuses unsafe checkpoints
            model_dir = Path(save_model(state, f"{tmp}/model"))
        else:
            found = state_file(store.configure(config), model_uri, dst_path=tmp)
            state = load_model_state(str(found))
            model_dir = found.parent.parent
        return PackedModel(pack(str(model_dir)), list(state["spec"]["classes"]))


def load_model(files: dict[str, bytes], directory: str, device: str | None = None):
    """Write packed files under ``directory`` and load them with ``mlflow.pyfunc.load_model``
    (on ``device``; None: MLflow's rule, the GPU when there is one)."""
    import mlflow.pyfunc

    for name, data in files.items():
        target = Path(directory) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return mlflow.pyfunc.load_model(directory, model_config={"device": device} if device else None)


def refusal(exc: BaseException) -> str:
    """The reason in an MLflow input error, without the dump of the data it carries."""
    text = str(exc)
    # "Failed to enforce schema of data '<the table>' with schema '<...>'. Error: <reason>"
    reason = text.rsplit("Error: ", 1)[-1] if "Failed to enforce schema" in text else text
    return one_line(reason, limit=300)


def predict(model, frame: pd.DataFrame) -> pd.DataFrame:
    """``model.predict(frame)``; a schema or input error becomes a DataValidationError."""
    from mlflow.exceptions import MlflowException

    try:
        return model.predict(frame)
    except MlflowException as exc:
        raise DataValidationError(f"the model refused the input: {refusal(exc)}") from None


def network_from_state(state: dict[str, Any]) -> tuple[nn.Module, FeatureSpec]:
    """The network a state holds (in eval mode) and the feature spec it expects: the model's
    in-process form, for tests and tools."""
    from training.config import ModelConfig
    from training.manifest import FeatureSpec
    from training.model.networks import build_model

    spec = FeatureSpec.from_dict(state["spec"])
    model = build_model(
        ModelConfig(**state["model_config"]),
        spec.input_shape,
        spec.num_outputs,
        spec.task,
        spec.cardinalities,
        spec.tokens,
    )
    model.load_state_dict(state["model"])
    model.eval()
    return model, spec
