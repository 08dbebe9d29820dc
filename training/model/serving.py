"""A checkpoint's network rebuilt from its state (weights, model config, feature spec).

What MLflow serves is the pyfunc in ``training/model/trainflow_pyfunc/`` (raw table in, labels and
probabilities out); this is the in-process form of the same network, for tests and tools.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from training.config import ModelConfig
from training.manifest import FeatureSpec
from training.model.networks import build_model


def model_from_state(state: dict[str, Any]) -> tuple[nn.Module, FeatureSpec]:
    """The network a checkpoint state holds (in eval mode), and the feature spec it expects."""
    spec = FeatureSpec.from_dict(state["spec"])
    model = build_model(
        ModelConfig(**state["model_config"]), spec.input_shape, spec.num_outputs, spec.task
    )
    model.load_state_dict(state["model"])
    model.eval()
    return model, spec
