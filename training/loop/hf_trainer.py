"""``train.engine: hf_trainer``: a ``transformers.Trainer`` in each TorchTrainer worker, as Ray
Train's Hugging Face guide runs it (``prepare_trainer``, ``RayTrainReportCallback``).

What stays trainflow's: the data (each worker's Ray Data shard through ``iter_torch_batches``
with trainflow's collate: the Trainer reads it as an iterable dataset, ``max_steps`` from the
rows and the batch), the network (the same ``HFClassifier`` the loop trains), the metrics the
loop names (train_loss, val_loss, val_accuracy per epoch) and the checkpoint: at each epoch's
save the callback reports trainflow's ``state.pt`` (``training.loop.checkpoint``), not the
Trainer's own directory, so evaluation, the gate and the registry read it unchanged.

A restarted worker group continues from the latest checkpoint's weights and history with a new
optimizer (the Trainer's optimizer state is not kept); the epochs left are trained.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from training.config import validate_config
from training.errors import TrainingDivergedError
from training.loop.checkpoint import load_state
from training.loop.collate import SplitCollate
from training.loop.hf_arguments import EnginePlan, engine_plan, training_arguments
from training.loop.loop import SquaredError, seed_everything
from training.manifest import FEATURES, LABEL, FeatureSpec
from training.metrics import regression_metrics
from training.model.hf_model import checkpoint_model_config
from training.model.networks import build_model

ENGINE = "hf_trainer"


class TrainerModel(nn.Module):
    """The loop's network with its loss, as a Trainer calls a model: ``model(**batch)`` ->
    ``{"loss", "logits"}``. ``network`` is what checkpoints hold."""

    def __init__(self, network: nn.Module, regression: bool) -> None:
        super().__init__()
        self.network = network
        self.loss_fn = SquaredError() if regression else nn.CrossEntropyLoss(reduction="sum")

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.network(features)
        if labels is None:
            return {"logits": logits}
        return {"loss": self.loss_fn(logits.float(), labels) / len(labels), "logits": logits}


class TrainerCollate(SplitCollate):
    """trainflow's collate (token ids padded per batch), keyed as ``TrainerModel`` takes them."""

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        tensors = super().__call__(batch)
        return {"features": tensors[FEATURES], "labels": tensors[LABEL]}


def epoch_metrics(logs: list[dict[str, Any]], epoch: int, world_size: int) -> dict[str, float]:
    """One epoch's Trainer logs (its training log, then its evaluation) under the loop's names."""
    merged: dict[str, Any] = {}
    for log in logs:
        merged.update(log)
    metrics = {"epoch": epoch, "train_loss": float(merged["loss"])}
    for key, value in merged.items():
        # The evaluation's metrics, not its timings (eval_runtime, eval_samples_per_second, ...).
        timing = key.endswith(("_runtime", "_per_second"))
        if key.startswith("eval_") and not timing and isinstance(value, int | float):
            metrics["val_" + key.removeprefix("eval_")] = float(value)
    metrics["lr"] = float(merged.get("learning_rate", 0.0))
    metrics["workers"] = float(world_size)
    return metrics


def _report_callback_class():
    """``RayTrainReportCallback`` reporting trainflow's metrics and checkpoint at each save."""
    import ray.train
    from ray.train.huggingface.transformers import RayTrainReportCallback

    from training.loop.checkpoint import save_state

    class TrainflowReportCallback(RayTrainReportCallback):
        def __init__(self, base_state: dict[str, Any], history: list) -> None:
            super().__init__()
            self.base_state, self.history = base_state, history  # history: resumed epochs too
            self._logged = 0  # log_history entries already reported

        def on_save(self, args, state, control, **kwargs):
            logs, self._logged = state.log_history[self._logged :], len(state.log_history)
            context = ray.train.get_context()
            epoch = len(self.history) + 1
            metrics = epoch_metrics(logs, epoch, context.get_world_size())
            self.history.append(metrics)
            if context.get_world_rank() != 0:
                ray.train.report(metrics)
                return
            network_state = kwargs["model"].network.state_dict()
            checkpoint = {**self.base_state, "model": network_state}
            checkpoint.update(epoch=epoch, history=list(self.history))
            with tempfile.TemporaryDirectory() as tmp:
                save_state(checkpoint, tmp)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))

    return TrainflowReportCallback


def compute_metrics_for(spec: FeatureSpec):
    """The Trainer's ``compute_metrics``: accuracy, or a regression's RMSE, MAE and R² in the
    label's unit (over every worker's predictions: the Trainer gathers them)."""

    def compute(prediction) -> dict[str, float]:
        logits = torch.as_tensor(prediction.predictions).double()
        labels = torch.as_tensor(prediction.label_ids).double()
        if not spec.is_regression:
            return {"accuracy": float((logits.argmax(dim=1) == labels).double().mean())}
        error = logits.reshape(-1) - labels
        sums = [len(labels), error.square().sum(), error.abs().sum(), labels.sum()]
        sums.append(labels.square().sum())
        return regression_metrics([float(s) for s in sums], scale=spec.label_std, prefix="")

    return compute


def _shard_batches(split: str, batch_size: int, spec: FeatureSpec, seed: int | None):
    """This worker's Ray Data shard of ``split``, iterable once per epoch (what
    ``prepare_trainer`` hands the Trainer's data loader)."""
    import ray.train

    collate = TrainerCollate(torch.float32 if spec.is_regression else torch.int64)
    shuffle = {} if seed is None else {"local_shuffle_buffer_size": 4 * batch_size}
    return ray.train.get_dataset_shard(split).iter_torch_batches(
        batch_size=batch_size, collate_fn=collate, local_shuffle_seed=seed, **shuffle
    )


def _resume(network: nn.Module) -> tuple[list[dict[str, float]], int]:
    """The latest checkpoint's history and epochs (its weights loaded), or ([], 0)."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return [], 0
    with tempfile.TemporaryDirectory(prefix="trainflow-resume-") as directory:
        state = load_state(checkpoint.to_directory(directory))
    network.load_state_dict(state["model"])
    return list(state["history"]), int(state["epoch"])


def hf_trainer_worker(
    settings: dict[str, Any], extra_callbacks: Sequence[Any] = ()
) -> list[dict[str, float]]:
    """``train_loop_per_worker`` of the TorchTrainer with ``train.engine: hf_trainer``;
    ``extra_callbacks``: more TrainerCallbacks (benchmark B10 stamps epochs with one)."""
    import ray.train
    from ray.train.huggingface.transformers import prepare_trainer
    from transformers import Trainer, TrainingArguments

    config = validate_config(settings["pipeline"])
    spec = FeatureSpec.from_dict(settings["spec"])
    seed_everything(config.train.seed)  # every rank builds the same initial weights
    network = build_model(
        config.model, spec.input_shape, spec.num_outputs, spec.task, spec.cardinalities, spec.tokens
    )
    history, done = _resume(network)
    world_size = ray.train.get_context().get_world_size()
    epochs = int(settings["max_epochs"]) - done
    if epochs <= 0:
        return history
    plan: EnginePlan = engine_plan(
        config.train, settings["split_rows"]["train"], world_size, epochs
    )
    base_state = {
        "spec": spec.to_dict(),
        "model_config": checkpoint_model_config(config.model, network),
        "engine": ENGINE,
    }
    callback = _report_callback_class()(base_state, history)
    with tempfile.TemporaryDirectory(prefix="trainflow-hf-trainer-") as scratch:
        trainer = Trainer(
            model=TrainerModel(network, spec.is_regression),
            args=TrainingArguments(**training_arguments(config.train, plan, scratch)),
            train_dataset=_shard_batches("train", plan.per_device_batch, spec, config.train.seed),
            eval_dataset=_shard_batches("val", plan.per_device_batch, spec, None),
            compute_metrics=compute_metrics_for(spec),
            callbacks=[callback, *extra_callbacks],
        )
        prepare_trainer(trainer).train()
    last = history[-1]["train_loss"] if history else 0.0
    if not math.isfinite(last):
        raise TrainingDivergedError(
            f"training diverged: train_loss={last} (lr={config.train.lr:g}); lower train.lr or "
            "the sweep's train.lr range"
        )
    return history
