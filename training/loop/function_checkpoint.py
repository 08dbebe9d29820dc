"""A function's checkpoint (``train.engine: function``) as the state trainflow evaluates,
registers and serves: ``model.pt``, the ``state_dict`` of the module ``model.factory`` builds,
loaded into that module as a custom model wraps it.

Loaded with ``weights_only=True``, as every checkpoint is: a pickle that would run code is
refused. A state_dict saved from the DDP wrapper (keys under ``module.``) is taken as well.
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
from training.manifest import FeatureSpec
from training.model.networks import build_model

_DDP_PREFIX = "module."


def _unwrapped(weights: dict[str, Any]) -> dict[str, Any]:
    """Keys as the factory's module names them (a DDP wrapper's ``module.`` dropped)."""
    if weights and all(key.startswith(_DDP_PREFIX) for key in weights):
        return {key.removeprefix(_DDP_PREFIX): value for key, value in weights.items()}
    return weights


def function_checkpoint_state(
    directory: str, config: PipelineConfig, spec: FeatureSpec
) -> dict[str, Any]:
    """The trainflow state of a function's checkpoint directory: the factory's module with the
    checkpoint's weights, the feature spec and the model config. FunctionContractError when
    ``model.pt`` is missing, unsafe, or does not fit the module."""
    path = os.path.join(directory, MODEL_FILE)
    where = f"the checkpoint {directory}"
    if not os.path.isfile(path):
        raise FunctionContractError(f"{where} has no {MODEL_FILE}; see {CONTRACT}")
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise FunctionContractError(
            f"{where}: {MODEL_FILE} holds more than tensors ({one_line(exc, 150)}); save "
            f"module.state_dict(), not the module; see {CONTRACT}"
        ) from None
    except Exception as exc:
        raise FunctionContractError(
            f"{where}: {MODEL_FILE} cannot be read ({type(exc).__name__}: {one_line(exc, 150)}); "
            f"see {CONTRACT}"
        ) from None
    if not isinstance(weights, dict):
        raise FunctionContractError(
            f"{where}: {MODEL_FILE} holds a {type(weights).__name__}, not a state_dict; save "
            f"module.state_dict(); see {CONTRACT}"
        )
    network = build_model(
        config.model, spec.input_shape, spec.num_outputs, spec.task, spec.cardinalities
    )
    try:
        network.net.load_state_dict(_unwrapped(weights))
    except RuntimeError as exc:
        raise FunctionContractError(
            f"{where}: {MODEL_FILE} does not fit the module model.factory="
            f"{config.model.factory!r} builds with model.params={dict(config.model.params)} "
            f"({one_line(exc, 200)}); see {CONTRACT}"
        ) from None
    return {
        "model": network.state_dict(),
        "spec": spec.to_dict(),
        "model_config": config.model.model_dump(mode="json"),
        "engine": ENGINE,
    }
