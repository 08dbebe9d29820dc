"""A user's own network: ``model.factory: "package.module:function"``, called as
``factory(spec, **model.params)``, must return an ``nn.Module`` mapping a batch of inputs
``(batch, *spec.input_shape)`` to ``(batch, spec.num_outputs)``.

Shipped inside the registered model (torch and the standard library only): the model rebuilds
the user's network from the factory path and params its state recorded; the user's package
travels beside this one in the model's ``code_paths``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TASKS = ("classification", "regression")


@dataclass(frozen=True)
class ModelSpec:
    """What trainflow knows of the data when it builds a model: the factory's first argument.

    ``input_shape``: ``(F,)`` for a table of F features, ``(C, H, W)`` for images;
    ``num_outputs``: classes, or 1 for regression; ``task``: "classification" or "regression";
    ``cardinalities``: per feature position of a table, the number of codes of a categorical
    position (its value is the integer code, as a float) and 0 for a number; empty for images.
    """

    input_shape: tuple[int, ...]
    num_outputs: int
    task: str = "classification"
    cardinalities: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, input_shape, num_outputs: int, task: str = "classification", cardinalities=None
    ) -> ModelSpec:
        cards = tuple(int(c) for c in cardinalities or ())
        return cls(tuple(int(d) for d in input_shape), int(num_outputs), task, cards)


def split_factory(path: str) -> tuple[str, str]:
    """``"pkg.mod:fn"`` -> ("pkg.mod", "fn"); ValueError when it is not of that form."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name.isidentifier():
        raise ValueError(f"{path!r} is not of the form 'package.module:function'")
    return module, name


def import_factory(path: str):
    """The object ``path`` names. The working directory is searched after ``sys.path``, as a
    user expects of code sitting in the project they run trainflow from."""
    module_name, name = split_factory(path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        # Only the factory's own package missing: a dependency it lacks is the user's to fix.
        if cwd in sys.path or (exc.name or "").split(".")[0] != module_name.split(".")[0]:
            raise
        sys.path.append(cwd)
        module = importlib.import_module(module_name)
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None


class CustomNetwork(nn.Module):
    """The user's module, fed ``(batch, *input_shape)``: trainflow's batches are flat rows."""

    def __init__(self, net: nn.Module, input_shape: tuple[int, ...]):
        super().__init__()
        self.net = net
        self.input_shape = tuple(input_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(-1, *self.input_shape))


def build_custom(model_config: Mapping[str, Any], spec: ModelSpec) -> CustomNetwork:
    """``factory(spec, **params)`` wrapped to take trainflow's flat rows."""
    factory = import_factory(str(model_config["factory"]))
    net = factory(spec, **dict(model_config.get("params") or {}))
    if not isinstance(net, nn.Module):
        raise TypeError(
            f"model.factory {model_config['factory']!r} returned {type(net).__name__}, "
            "not a torch.nn.Module"
        )
    return CustomNetwork(net, spec.input_shape)
