"""The networks of a ``ModelConfig``. The classes live in the registered model's own package
(``trainflow_pyfunc.networks``, torch only), so training and serving build the same modules."""

from __future__ import annotations

from torch import nn

from training.config import ModelConfig
from training.model.trainflow_pyfunc.networks import CNN, MLP, build_network

__all__ = ["CNN", "MLP", "build_model"]


def build_model(
    cfg: ModelConfig,
    input_shape: list[int],
    num_outputs: int,
    task: str = "classification",
    cardinalities: list[int] | None = None,
    tokens: dict | None = None,
) -> nn.Module:
    """The network for a model config and a feature spec's shape, outputs, task and
    categorical positions (a text model: its tokenizer state; pretrained weights and a LoRA
    adapter are built here, training's side, not by the registered model's package)."""
    if cfg.kind == "hf":
        from training.model.hf_model import build_hf_training_network

        return build_hf_training_network(cfg.model_dump(), num_outputs, task, tokens or {})
    return build_network(cfg.model_dump(), input_shape, num_outputs, task, cardinalities)
