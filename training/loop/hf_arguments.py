"""``train.engine: hf_trainer``'s plan: how many optimizer steps an epoch is on each worker (an
iterable shard has no length, so the Trainer needs ``max_steps``), and the
``transformers.TrainingArguments`` trainflow's own keys map to, with ``train.hf_args`` on top.

Plain data only (no transformers import): unit tests check the mapping without a Trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from training.config.schema_train import TrainConfig


@dataclass(frozen=True)
class EnginePlan:
    """One worker's share of the run: rows per forward pass and optimizer steps per epoch."""

    per_device_batch: int
    steps_per_epoch: int
    epochs: int

    @property
    def max_steps(self) -> int:
        return self.steps_per_epoch * self.epochs


def engine_plan(train: TrainConfig, train_rows: int, world_size: int, epochs: int) -> EnginePlan:
    """The global batch split across workers, as the loop splits it; each worker's shard holds
    ``train_rows // world_size`` rows (Ray Data's equal split leaves the remainder out)."""
    per_device = max(1, train.batch_size // world_size)
    shard_rows = max(1, train_rows // world_size)
    return EnginePlan(per_device, math.ceil(shard_rows / per_device), epochs)


def _schedule(train: TrainConfig) -> str:
    # The loop's cosine decays per epoch; the Trainer's decays per step over the same span.
    if train.lr_schedule == "cosine":
        return "cosine"
    return "constant_with_warmup" if train.warmup_ratio else "constant"


def training_arguments(train: TrainConfig, plan: EnginePlan, output_dir: str) -> dict[str, Any]:
    """``TrainingArguments`` keywords: trainflow's keys mapped, then ``train.hf_args`` (which
    validation has kept to keys trainflow does not set)."""
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "learning_rate": train.lr,
        "per_device_train_batch_size": plan.per_device_batch,
        "per_device_eval_batch_size": plan.per_device_batch,
        "num_train_epochs": plan.epochs,
        "max_steps": plan.max_steps,
        "weight_decay": train.weight_decay,
        "warmup_steps": float(train.warmup_ratio),  # a float below 1: a ratio of max_steps
        "lr_scheduler_type": _schedule(train),
        "seed": train.seed,
        "bf16": train.precision == "bf16",
        "use_cpu": not train.use_gpu,
        # Once per epoch, all three together: RayTrainReportCallback reports at each save,
        # and the metrics it reports must be the epoch's.
        "eval_strategy": "epoch",
        "save_strategy": "epoch",
        "logging_strategy": "epoch",
        "save_only_model": True,
        "save_total_limit": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "label_names": ["labels"],
        "ddp_find_unused_parameters": False,
        "dataloader_num_workers": 0,  # Ray Data already prefetches in its own threads
    }
    args.update(train.hf_args)
    return args
