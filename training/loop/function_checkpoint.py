"""A user's checkpoint as the state trainflow evaluates, registers and serves: the weights of
the module ``model.factory`` builds, loaded into that module as a custom model wraps it.

``train.engine: function``: ``model.pt``, the module's ``state_dict`` (a DDP wrapper's
``module.`` keys are taken as well). ``train.engine: lightning``: the ``state_dict`` entry of the
``checkpoint.ckpt`` Ray's report callback saved (optimizer and loop state are left behind).

Loaded with ``weights_only=True``, as every checkpoint is: a pickle that would run code is
refused. (A Lightning checkpoint may keep the module's hyperparameters, among them the
factory's ``spec``: trainflow's own plain dataclass is allowed too.)
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

from training.config import PipelineConfig
from training.errors import FunctionContractError, one_line
from training.loop.function_engine import ENGINE
from training.loop.function_reports import CONTRACT, MODEL_FILE
from training.loop.lightning_engine import CHECKPOINT_FILE as LIGHTNING_FILE
from training.loop.lightning_engine import ENGINE as LIGHTNING_ENGINE
from training.manifest import FeatureSpec
from training.model.networks import build_model

_DDP_PREFIX = "module."
_LIGHTNING_WEIGHTS = "state_dict"  # the module's weights in a Lightning checkpoint


def _unwrapped(weights: dict[str, Any]) -> dict[str, Any]:
    """Keys as the factory's module names them (a DDP wrapper's ``module.`` dropped)."""
    if weights and all(key.startswith(_DDP_PREFIX) for key in weights):
        return {key.removeprefix(_DDP_PREFIX): value for key, value in weights.items()}
    return weights


def user_checkpoint_state(
    directory: str, config: PipelineConfig, spec: FeatureSpec
) -> dict[str, Any]:
    """The trainflow state of the checkpoint directory of a function or LightningModule."""
    if config.train.engine == LIGHTNING_ENGINE:
        return lightning_checkpoint_state(directory, config, spec)
    return function_checkpoint_state(directory, config, spec)


def function_checkpoint_state(
    directory: str, config: PipelineConfig, spec: FeatureSpec
) -> dict[str, Any]:
    """The trainflow state of a function's checkpoint directory: the factory's module with the
    checkpoint's weights, the feature spec and the model config. FunctionContractError when
    ``model.pt`` is missing, unsafe, or does not fit the module."""
    weights = _load(directory, MODEL_FILE, "save module.state_dict(), not the module")
    if not isinstance(weights, dict):
        raise FunctionContractError(
            f"the checkpoint {directory}: {MODEL_FILE} holds a {type(weights).__name__}, not a "
            f"state_dict; save module.state_dict(); see {CONTRACT}"
        )
    return _state(_unwrapped(weights), MODEL_FILE, directory, config, spec, ENGINE)


def lightning_checkpoint_state(
    directory: str, config: PipelineConfig, spec: FeatureSpec
) -> dict[str, Any]:
    """The trainflow state of a Lightning checkpoint directory (``checkpoint.ckpt``): the
    module's ``state_dict`` in the factory's module. FunctionContractError when the file is
    missing, unsafe, holds no ``state_dict`` or does not fit the module."""
    from training.model.trainflow_pyfunc.custom import ModelSpec

    # The checkpoint keeps save_hyperparameters()' values: the factory's spec among them.
    with torch.serialization.safe_globals([ModelSpec]):
        saved = _load(directory, LIGHTNING_FILE, "keep the module's hyperparameters plain data")
    weights = saved.get(_LIGHTNING_WEIGHTS) if isinstance(saved, dict) else None
    if not isinstance(weights, dict):
        raise FunctionContractError(
            f"the checkpoint {directory}: {LIGHTNING_FILE} has no {_LIGHTNING_WEIGHTS} (not a "
            f"Lightning checkpoint); see {CONTRACT}"
        )
    return _state(weights, LIGHTNING_FILE, directory, config, spec, LIGHTNING_ENGINE)


def _load(directory: str, name: str, fix: str) -> Any:
    """``torch.load(directory/name, weights_only=True)``; FunctionContractError naming the file
    when it is missing, holds more than tensors and plain data, or cannot be read."""
    path = os.path.join(directory, name)
    where = f"the checkpoint {directory}"
    if not os.path.isfile(path):
        raise FunctionContractError(f"{where} has no {name}; see {CONTRACT}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise FunctionContractError(
            f"{where}: {name} holds more than tensors ({one_line(exc, 150)}); {fix}; see {CONTRACT}"
        ) from None
    except Exception as exc:
        raise FunctionContractError(
            f"{where}: {name} cannot be read ({type(exc).__name__}: {one_line(exc, 150)}); "
            f"see {CONTRACT}"
        ) from None


def _state(
    weights: dict[str, Any],
    name: str,
    directory: str,
    config: PipelineConfig,
    spec: FeatureSpec,
    engine: str,
) -> dict[str, Any]:
    """``weights`` in the factory's module, as the state a custom model's checkpoint holds."""
    network = build_model(
        config.model, spec.input_shape, spec.num_outputs, spec.task, spec.cardinalities
    )
    try:
        network.net.load_state_dict(weights)
    except RuntimeError as exc:
        raise FunctionContractError(
            f"the checkpoint {directory}: {name} does not fit the module model.factory="
            f"{config.model.factory!r} builds with model.params={dict(config.model.params)} "
            f"({one_line(exc, 200)}); see {CONTRACT}"
        ) from None
    return {
        "model": network.state_dict(),
        "spec": spec.to_dict(),
        "model_config": config.model.model_dump(mode="json"),
        "engine": engine,
    }
