"""A user's model factory (``model.kind: custom``) checked before anything starts, and where its
code lives: shipped to Ray workers (runtime_env ``py_modules``) and into the registered model
(``code_paths``) when it is not installed. A user's training function (``train.function``) is
imported and shipped to the workers the same way.

Every failure is one ``ConfigError`` naming the key (``model.factory``, ``train.function``), what
is wrong and the fix.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from training.config import ModelConfig
from training.errors import ConfigError, one_line
from training.model.trainflow_pyfunc.custom import ModelSpec, import_factory, split_factory

__all__ = ["ModelSpec", "check_factory", "code_paths", "ship_paths"]

# Packages every environment that trains or serves a model has: never shipped.
_PROVIDED = {"torch", "numpy", "pandas", "mlflow", "training", "trainflow_pyfunc"}
_SIGNATURE = "def build(spec, **params) -> torch.nn.Module"


def _bad(path: str, what: str, fix: str, key: str = "model.factory") -> ConfigError:
    return ConfigError(f"{key}={path!r}: {what}; {fix}")


def load_factory(factory: str):
    """The callable ``factory`` names; ConfigError when it cannot be imported or called."""
    return load_callable(factory, "model.factory", _SIGNATURE)


def load_callable(path: str, key: str, signature: str):
    """The callable ``path`` ("package.module:name") names, imported as a factory is; a
    ConfigError naming ``key`` when it cannot be imported or is not callable."""
    module_name, _ = split_factory(path)
    try:
        obj = import_factory(path)
    except ModuleNotFoundError as exc:
        raise _bad(
            path,
            f"cannot import {module_name!r} ({one_line(exc)})",
            "install the package, or run trainflow from the directory that holds it "
            "(or add that directory to PYTHONPATH)",
            key,
        ) from None
    except AttributeError as exc:
        raise _bad(path, one_line(exc), "name a function defined in that module", key) from None
    except Exception as exc:  # the module itself raised while importing
        raise _bad(
            path,
            f"importing {module_name!r} raised {type(exc).__name__}: {one_line(exc)}",
            "fix the module so that it imports",
            key,
        ) from None
    if not callable(obj):
        raise _bad(
            path, f"{type(obj).__name__} is not callable", f"name a function: {signature}", key
        )
    return obj


def check_factory(
    model: ModelConfig,
    spec: ModelSpec,
    swept: Mapping[str, Any] | None = None,
    lightning: bool = False,
) -> None:
    """Build the user's model once on the driver, and pass a batch of two through it.

    ``swept``: ``model.params`` values a sweep may set (one per swept key), so that a factory
    refusing a swept keyword fails here, not in a trial. ``lightning``: the factory must
    return a LightningModule (``train.engine: lightning``). ConfigError on any problem.
    """
    if model.kind != "custom" or model.factory is None:
        return
    factory, params = model.factory, {**model.params, **dict(swept or {})}
    build = load_factory(factory)
    try:
        net = build(spec, **params)
    except Exception as exc:
        raise _bad(
            factory,
            f"calling it with spec={spec} and params={params} raised "
            f"{type(exc).__name__}: {one_line(exc)}",
            f"it is called as {_SIGNATURE}; fix it or model.params",
        ) from None
    if lightning:
        from training.model.lightning_module import check_lightning_module

        check_lightning_module(factory, net)
    if not isinstance(net, nn.Module):
        raise _bad(
            factory,
            f"it returned {type(net).__name__}, not a torch.nn.Module",
            f"return the network: {_SIGNATURE}",
        )
    batch = torch.zeros(2, *spec.input_shape)
    try:
        with torch.no_grad():
            out = net.eval()(batch)
    except Exception as exc:
        raise _bad(
            factory,
            f"its module fails on a batch of shape {tuple(batch.shape)}: "
            f"{type(exc).__name__}: {one_line(exc)}",
            "it must take (batch, *spec.input_shape)",
        ) from None
    want = (2, spec.num_outputs)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise _bad(
            factory,
            f"its module maps a batch of shape {tuple(batch.shape)} to {got}, not {want}",
            f"for {spec.task} it must return (batch, spec.num_outputs) = (batch, "
            f"{spec.num_outputs})",
        )


def _top_level_path(path: str, key: str = "model.factory") -> str | None:
    """The file or directory of the callable's top-level module (what an importer needs)."""
    top = split_factory(path)[0].split(".")[0]
    if top in _PROVIDED or top in sys.stdlib_module_names:
        return None
    try:
        import_factory(path)  # the same search as the loop: sys.path, then the working dir
        found = importlib.util.find_spec(top)
    except Exception:  # not importable as named (the checks before Ray say why)
        found = None
    if found is None or not found.origin and not found.submodule_search_locations:
        raise _bad(
            path,
            f"cannot find the package {top!r} to ship with the model",
            "run trainflow where the package is importable (installed, PYTHONPATH or the "
            "working directory)",
            key,
        )
    if found.submodule_search_locations:  # a package (regular or namespace)
        return list(found.submodule_search_locations)[0]
    return found.origin


def _installed(path: str) -> bool:
    """True for code in this environment's site-packages (nodes install it like trainflow)."""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    path = os.path.realpath(path)
    return any(path.startswith(os.path.realpath(r) + os.sep) for r in roots)


def code_paths(model_config: Mapping[str, Any]) -> list[str]:
    """What the registered model carries besides trainflow's own code: the factory's top-level
    package (or module) from the user's project, so the model loads where it is not installed.
    An installed package is a requirement instead (:func:`requirements`)."""
    if model_config.get("kind") != "custom":
        return []
    path = _top_level_path(str(model_config["factory"]))
    return [path] if path and not _installed(path) else []


def requirements(model_config: Mapping[str, Any]) -> list[str]:
    """The pinned distribution of an installed factory package (``name==version``)."""
    import importlib.metadata

    if model_config.get("kind") != "custom":
        return []
    path = _top_level_path(str(model_config["factory"]))
    if not path or not _installed(path):
        return []
    top = split_factory(str(model_config["factory"]))[0].split(".")[0]
    pins = []
    for dist in importlib.metadata.packages_distributions().get(top, [])[:1]:
        pins.append(f"{dist}=={importlib.metadata.version(dist).split('+')[0]}")
    return pins


def ship_paths(model: ModelConfig, train_function: str | None = None) -> list[str]:
    """What Ray's ``py_modules`` must carry to every worker: the factory's package, and the
    package of ``train.function`` (``train_function``), when not installed (they sit in the
    user's project directory)."""
    named = [(str(model.factory), "model.factory")] if model.kind == "custom" else []
    if train_function:
        named.append((train_function, "train.function"))
    paths: list[str] = []
    for callable_path, key in named:
        path = _top_level_path(callable_path, key)
        if path and not _installed(path) and path not in paths:
            paths.append(path)
    return paths
