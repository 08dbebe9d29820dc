"""The networks, nothing else: an MLP for feature vectors, a small CNN and ResNet-18 for images,
and a user's own network (``model.kind: custom``).

Torch only: trainflow trains these classes and the registered model rebuilds them from the same
file, so a checkpoint's ``state_dict`` keys always match.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .custom import ModelSpec, build_custom
from .resnet import ResNet18


def embedding_size(cardinality: int) -> int:
    """An embedding's width from its number of codes (fast.ai's rule of thumb, at most 16)."""
    return max(1, min(16, round(1.6 * cardinality**0.56)))


class MLP(nn.Module):
    """Dense blocks (Linear, ReLU, Dropout per hidden size), then a linear head.

    ``cardinalities`` (per feature position; 0 a number): each categorical position's code is
    embedded and the embeddings are concatenated with the numeric positions."""

    def __init__(
        self,
        num_features: int,
        num_classes: int,
        hidden_sizes: list[int],
        dropout: float,
        cardinalities: list[int] | None = None,
    ):
        super().__init__()
        cards = list(cardinalities or [])
        categorical = [i for i, c in enumerate(cards) if c > 0]
        self.register_buffer(
            "categorical", torch.tensor(categorical, dtype=torch.long), persistent=False
        )
        numeric = [i for i in range(num_features) if i not in set(categorical)]
        self.register_buffer("numeric", torch.tensor(numeric, dtype=torch.long), persistent=False)
        self.embeddings = nn.ModuleList(
            nn.Embedding(cards[i], embedding_size(cards[i])) for i in categorical
        )
        layers: list[nn.Module] = []
        width = len(numeric) + sum(e.embedding_dim for e in self.embeddings)
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        if not len(self.embeddings):
            return self.net(x)
        codes = x.index_select(1, self.categorical).round().long()
        parts = [x.index_select(1, self.numeric)]
        parts += [embed(codes[:, i]) for i, embed in enumerate(self.embeddings)]
        return self.net(torch.cat(parts, dim=1))


class CNN(nn.Module):
    """Conv blocks (3x3 conv, ReLU, 2x2 max-pool while the image is large enough), then dense."""

    def __init__(
        self,
        input_shape: list[int],
        num_classes: int,
        channels: list[int],
        hidden: int,
        dropout: float,
    ):
        super().__init__()
        self.input_shape = tuple(input_shape)
        in_ch, height, width = input_shape
        blocks: list[nn.Module] = []
        for out_ch in channels:
            blocks += [nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1), nn.ReLU()]
            if min(height, width) >= 4:
                blocks.append(nn.MaxPool2d(2))
                height, width = height // 2, width // 2
            in_ch = out_ch
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_ch * height * width, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(-1, *self.input_shape)))


def build_network(
    model_config: Mapping[str, Any],
    input_shape: list[int],
    num_classes: int,
    task: str = "classification",
    cardinalities: list[int] | None = None,
    tokens: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The network of a model config (``ModelConfig`` as a plain dict, as checkpoints hold it);
    ``cardinalities``: per feature position, a categorical's number of codes (0: a number);
    ``tokens``: a text model's tokenizer state (the spec's)."""
    kind = model_config.get("kind")
    if kind == "hf":
        if task == "causal_lm":  # a language model's own head: next-token logits
            from .causal_lm import build_causal_lm_network

            return build_causal_lm_network(model_config, tokens or {})
        from .hf import build_hf_network  # transformers: only a text model needs it

        return build_hf_network(model_config, num_classes, task, tokens or {})
    if kind == "custom":
        spec = ModelSpec.of(input_shape, num_classes, task, cardinalities)
        return build_custom(model_config, spec)
    dropout = float(model_config.get("dropout", 0.0))
    if kind in ("cnn", "resnet18") and len(input_shape) != 3:
        raise ValueError(f"model.kind={kind} needs an image shape [C, H, W], got {input_shape}")
    if kind == "resnet18":
        return ResNet18(list(input_shape), num_classes)
    if kind == "cnn":
        return CNN(
            list(input_shape),
            num_classes,
            list(model_config["channels"]),
            int(model_config["cnn_hidden"]),
            dropout,
        )
    hidden = list(model_config["hidden_sizes"])
    return MLP(math.prod(input_shape), num_classes, hidden, dropout, cardinalities)
