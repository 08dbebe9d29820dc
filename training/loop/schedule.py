"""The loop's optimizer and learning rate: AdamW over the trainable parameters, a per-epoch
schedule (constant or cosine), and a linear warm-up over the first ``train.warmup_ratio`` of the
optimizer steps (steps known from the train split's rows and the global batch)."""

from __future__ import annotations

import functools
import math

import torch
from torch import nn


def optimizer_and_schedule(model: nn.Module, train, max_epochs: int):
    """AdamW over the model's trainable parameters (a LoRA model's adapter and head) and its
    per-epoch LR schedule."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=train.lr, weight_decay=train.weight_decay)
    if train.lr_schedule == "cosine" and not train.warmup_ratio:
        return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_epochs)
    # Closed form (LambdaLR): the warm-up scales each step's LR in place, which
    # CosineAnnealingLR's recursive form would carry into the next epoch.
    decay = functools.partial(
        epoch_factor, cosine=train.lr_schedule == "cosine", max_epochs=max_epochs
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, decay)


def epoch_factor(epoch: int, cosine: bool, max_epochs: int) -> float:
    """The LR's factor in ``epoch``: CosineAnnealingLR's closed form, or 1 (constant)."""
    return 0.5 * (1 + math.cos(math.pi * epoch / max_epochs)) if cosine else 1.0


def warmup_steps(train, max_epochs: int, train_rows: int | None) -> int:
    """Optimizer steps of the warm-up: ``train.warmup_ratio`` of all the run's steps."""
    return math.ceil(train.warmup_ratio * max_epochs * steps_per_epoch(train, train_rows))


def steps_per_epoch(train, train_rows: int | None) -> int:
    """Optimizer steps per epoch: the train split's rows over the global batch (0: unknown)."""
    return math.ceil(train_rows / train.batch_size) if train_rows else 0


def warm_up(optimizer, scheduler, step: int, steps: int) -> None:
    """Each group's LR for optimizer step ``step`` (from 1): the epoch's, times step / steps
    while the warm-up lasts."""
    factor = min(1.0, step / steps)
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr * factor
