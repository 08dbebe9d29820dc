"""A checkpoint's network rebuilt, and packaged for serving with its normalisation inside."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.config import ModelConfig
from training.manifest import FeatureSpec
from training.model.networks import build_model


class NormalizedClassifier(nn.Module):
    """Raw features in, logits out: the train-split normalisation travels with the model.

    This is what gets logged to MLflow, so that serving needs no separate preprocessing.
    """

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        safe_std = [s if s > 0 else 1.0 for s in std]
        self.register_buffer("std", torch.tensor(safe_std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x.flatten(1) - self.mean) / self.std)


def model_from_state(state: dict[str, Any]) -> tuple[nn.Module, FeatureSpec]:
    """The network a checkpoint state holds (in eval mode), and the feature spec it expects."""
    spec = FeatureSpec.from_dict(state["spec"])
    model = build_model(ModelConfig(**state["model_config"]), spec.input_shape, spec.num_classes)
    model.load_state_dict(state["model"])
    model.eval()
    return model, spec


def serving_model(state: dict[str, Any]) -> NormalizedClassifier:
    """Raw features in, logits out: what MLflow serves."""
    model, spec = model_from_state(state)
    return NormalizedClassifier(model, spec.mean, spec.std).eval()
