"""The network, built from trainflow's spec: ``build(spec, **model.params)`` (``model.factory``).

trainflow calls it to rebuild the module your function trained, when it evaluates, registers
and serves the checkpoint's ``model.pt``; your function calls it to build the module it trains.
"""

from __future__ import annotations

import math

from torch import nn


def build(spec, width: int = 64) -> nn.Module:
    """An MLP from ``(batch, *spec.input_shape)`` to ``(batch, spec.num_outputs)``."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(spec.input_shape), width),
        nn.ReLU(),
        nn.Linear(width, spec.num_outputs),
    )
