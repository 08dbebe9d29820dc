"""``train.hf_args``: the ``transformers.TrainingArguments`` a user brings to ``train.engine:
hf_trainer``. Keys that fight trainflow are refused here, at validation, with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_DISTRIBUTION = "Ray Train handles distribution (train.num_workers, train.use_gpu)"
_OUTPUT = "trainflow writes checkpoints under the run's storage and registers the model"
_REPORTING = "trainflow reports per epoch to MLflow and Ray Train"

#: Arguments trainflow owns, and why a user's value would fight it.
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        (
            "deepspeed",
            "fsdp",
            "fsdp_config",
            "parallelism_config",
            "local_rank",
            "ddp_backend",
            "ddp_timeout",
            "use_cpu",
            "accelerator_config",
        ),
        _DISTRIBUTION,
    ),
    **dict.fromkeys(
        (
            "output_dir",
            "save_strategy",
            "save_steps",
            "save_total_limit",
            "save_on_each_node",
            "save_only_model",
            "load_best_model_at_end",
            "metric_for_best_model",
            "greater_is_better",
            "resume_from_checkpoint",
            "push_to_hub",
            "hub_model_id",
            "hub_token",
            "hub_strategy",
        ),
        _OUTPUT,
    ),
    **dict.fromkeys(
        ("logging_strategy", "logging_steps", "eval_strategy", "eval_steps", "run_name"),
        _REPORTING + " (once per epoch)",
    ),
    "max_steps": "trainflow computes it from the train split's rows and the batch size",
    "remove_unused_columns": "trainflow's batches hold exactly the model's inputs",
    "label_names": "trainflow's batches name the label",
    "gradient_accumulation_steps": "train.batch_size is the global batch: set that",
}

#: TrainingArguments that trainflow's own keys set: the key to use instead.
MAPPED: dict[str, str] = {
    "learning_rate": "train.lr",
    "per_device_train_batch_size": "train.batch_size (global, split across workers)",
    "per_device_eval_batch_size": "train.batch_size (global, split across workers)",
    "num_train_epochs": "train.max_epochs",
    "weight_decay": "train.weight_decay",
    "warmup_steps": "train.warmup_ratio",
    "warmup_ratio": "train.warmup_ratio",
    "lr_scheduler_type": "train.lr_schedule",
    "seed": "train.seed",
    "bf16": "train.precision",
}


def _training_argument_names() -> set[str]:
    import dataclasses

    from transformers import TrainingArguments

    return {field.name for field in dataclasses.fields(TrainingArguments)}


def hf_args_problems(hf_args: Mapping[str, Any]) -> list[str]:
    """Why each key of ``hf_args`` cannot be used (empty: all fine)."""
    problems = []
    for key, value in hf_args.items():
        if key == "report_to":
            if value in ("none", [], ["none"], None):
                continue
            problems.append(f"report_to={value!r}: only 'none'; {_REPORTING}")
        elif key in REFUSED:
            problems.append(f"{key}: {REFUSED[key]}")
        elif key in MAPPED:
            problems.append(f"{key}: set {MAPPED[key]} instead")
    unknown = set(hf_args) - set(REFUSED) - set(MAPPED) - {"report_to"}
    if unknown:
        known = _training_argument_names()
        for key in sorted(unknown - known):
            problems.append(f"{key}: not a transformers.TrainingArguments field")
    return problems
