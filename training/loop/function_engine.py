"""``train.engine: function``: the user's own ``train_loop_per_worker(config)``, run by the one
TorchTrainer in the final training and in every sweep trial, as the Ray Train guides run it.

trainflow hands the function a plain dict (:func:`function_config`) and the Ray Data shards
"train" and "val" it prepared; the function trains as it likes, reports with
``ray.train.report`` and resumes with ``ray.train.get_checkpoint()``. What trainflow needs back
(a report per epoch carrying the ranked metric, checkpoints holding ``model.pt``) is checked by
``training.loop.function_reports`` and ``training.loop.function_checkpoint``;
docs/your-training-code.md is the contract.

The function travels as its path, never as a pickle: each worker imports it the way a model
factory is imported (its package shipped with ``py_modules`` when not installed).
"""

from __future__ import annotations

import inspect
from typing import Any

from training.config import PipelineConfig
from training.errors import ConfigError
from training.manifest import FeatureSpec

ENGINE = "function"
SIGNATURE = "def train_func(config: dict) -> None"
#: The hyperparameters every function gets; a swept ``train.<key>`` joins them.
BASE_KEYS = ("lr", "batch_size", "max_epochs", "weight_decay", "seed")


def function_config(config: PipelineConfig, spec: FeatureSpec, max_epochs: int) -> dict[str, Any]:
    """What the user's function receives as ``config``: plain data only.

    ``lr``, ``batch_size`` (the global batch), ``max_epochs`` (a trial's: ``sweep.asha.max_t``),
    ``weight_decay``, ``seed`` and every swept ``train.<key>`` under its short name, after the
    sweep's sample; ``params``: ``model.params`` (the factory's keywords); ``spec``: what a
    factory's spec says (input shape, outputs, task, classes, categorical cardinalities)."""
    train = config.train.model_dump(mode="json")
    swept = [key.split(".", 1)[1] for key in config.sweep.search_space if key.startswith("train.")]
    values = {key: train[key] for key in (*BASE_KEYS, *swept) if key in train}
    values["max_epochs"] = int(max_epochs)
    return {
        **values,
        "params": dict(config.model.params),
        "spec": {
            "input_shape": list(spec.input_shape),
            "num_outputs": spec.num_outputs,
            "task": spec.task,
            "classes": list(spec.classes),
            "cardinalities": list(spec.cardinalities),
        },
    }


def function_settings(config: PipelineConfig, spec: FeatureSpec, max_epochs: int) -> dict:
    """The TorchTrainer's ``train_loop_config``: the function's path and its ``config``."""
    return {"function": config.train.function, "config": function_config(config, spec, max_epochs)}


def function_worker(settings: dict[str, Any]) -> None:
    """``train_loop_per_worker``: import the user's function on this worker and call it."""
    from training.model.trainflow_pyfunc.custom import import_factory

    import_factory(settings["function"])(settings["config"])


def check_function(path: str) -> None:
    """ConfigError naming ``train.function`` unless it imports, is callable and takes one
    positional ``config``: checked on the driver before anything starts."""
    from training.model.factory import load_callable

    function = load_callable(path, "train.function", SIGNATURE)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    try:
        signature.bind({})
    except TypeError as exc:
        raise ConfigError(
            f"train.function={path!r}: its signature {signature} cannot be called with one "
            f"config dict ({exc}); Ray Train calls it as {SIGNATURE}"
        ) from None
