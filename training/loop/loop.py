"""The training loop, written once; run by Tune trials and by Ray Train workers alike.

What differs between the two (data shards, rank, reporting, checkpoints) is the context's job
(``training.loop.contexts``); this module holds what they share: the epochs, the optimizer steps,
validation, and the state each checkpoint keeps.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from training.config import PipelineConfig, validate_config
from training.errors import TrainingDivergedError
from training.loop import deepspeed_engine, sharding
from training.loop.compiling import CompiledSteps, training_steps
from training.loop.contexts import LoopContext, TrainContext, epoch_seed
from training.loop.profiling import StepProfiler, profiler_for
from training.loop.records import worker_result
from training.loop.run_state import Start, checkpoint_state, mid_epoch_checkpoint, resume
from training.loop.schedule import optimizer_and_schedule, set_lr, steps_per_epoch, total_steps
from training.loop.step_eval import validate_if_due
from training.loop.throughput import EpochClock
from training.loop.validation import validate as _validate
from training.manifest import FeatureSpec
from training.model.hf_model import checkpoint_model_config, enable_gradient_checkpointing
from training.model.networks import build_model
from training.model.trainflow_pyfunc.causal_lm import NextTokenLoss, target_count


def loop_config(
    config: PipelineConfig,
    spec: FeatureSpec,
    max_epochs: int,
    every_n_batches: int = 0,
    max_workers: int = 1,
    split_rows: dict[str, int] | None = None,
    final: bool = False,
) -> dict[str, Any]:
    """The plain-data argument every worker/trial receives (picklable, JSON-able).

    ``every_n_batches`` > 0 adds mid-epoch checkpoints (final training only: in a sweep every
    report is one ASHA iteration, so trials report once per epoch). ``max_workers`` sizes the
    micro-batches that keep the global batch constant when an elastic group shrinks.
    ``split_rows`` (the manifest's rows per split) lets a worker size its shard before reading it
    (and the LR schedule count its steps). ``final``: the final training, which alone validates
    every ``train.eval_every_steps`` and profiles (``train.profile``): a trial has no run to
    log them to.
    """
    train = config.train
    return {
        "pipeline": config.model_dump(mode="json"),
        "spec": spec.to_dict(),
        "max_epochs": max_epochs,
        "every_n_batches": every_n_batches,
        "max_workers": max_workers,
        "split_rows": dict(split_rows or {}),
        "eval_every_steps": (train.eval_every_steps or 0) if final else 0,
        "profile_steps": train.profile.steps if final and train.profile else 0,
    }


def step_plan(global_batch: int, world_size: int, max_workers: int) -> tuple[int, int]:
    """(rows per worker per optimizer step, rows per forward pass).

    The global batch is split across the workers there are, so an elastic group that lost
    workers still steps on ``global_batch`` rows (exactly when the worker count divides it).
    Each worker accumulates gradients over micro-batches no larger than at full size
    (``global_batch / max_workers``), so its memory per forward pass does not grow.
    """
    per_worker = max(1, global_batch // world_size)
    micro = max(1, math.ceil(global_batch / max(max_workers, world_size)))
    return per_worker, min(micro, per_worker)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


@dataclass
class _Run:
    """One run of the loop: what it trains, how, and where it reports."""

    ctx: LoopContext
    config: PipelineConfig
    spec: FeatureSpec
    max_epochs: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    history: list[dict[str, float]] = field(default_factory=list)
    every_n_batches: int = 0
    batch_rows: int = 1  # per worker per optimizer step
    micro_rows: int = 1  # per forward pass
    loss_fn: nn.Module = field(default_factory=lambda: nn.CrossEntropyLoss(reduction="sum"))
    model_config: dict[str, Any] = field(default_factory=dict)  # as checkpoints record it
    steps_per_epoch: int = 0
    total_steps: int = 0  # optimizer steps of the run; 0 (unknown): the LR schedule is per epoch
    global_step: int = 0  # optimizer steps done, over all epochs
    last_lr: float = 0.0  # the LR the last optimizer step took
    eval_every_steps: int = 0
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    steps: CompiledSteps | None = None  # train.compile: what the training steps call
    profiler: StepProfiler | None = None


def run_loop(settings: dict[str, Any], ctx: LoopContext) -> list[dict[str, float]]:
    """Train for ``max_epochs``, reporting once per epoch; resume from the context's state.

    Returns the full per-epoch history (also kept in every checkpoint so it survives restarts).
    """
    run = _train(settings, ctx)
    if run.profiler is not None:  # a caller that asked for a profile (train_worker keeps it)
        run.profiler.finish()
    return run.history


def train_worker(settings: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker`` of the TorchTrainer: the history, step validations, profile."""
    run = _train(settings, TrainContext.from_settings(settings))
    profile = run.profiler.finish() if run.profiler is not None else None
    return worker_result(run.history, run.step_metrics, profile)


def _train(settings: dict[str, Any], ctx: LoopContext) -> _Run:
    """The whole run: built, resumed, wrapped (and compiled), trained epoch by epoch."""
    run = _build_run(settings, ctx)
    state = ctx.latest_state()
    start = resume(run, state)
    _distribute(run, ctx)
    if state is not None:
        # Now that the parameters sit on their device (a GPU with use_gpu), torch puts the
        # optimizer's moments beside them; loaded before, they stayed on the CPU.
        sharding.load_optimizer_state(run.model, run.optimizer, state["optimizer"])
        set_lr(run.optimizer, run.scheduler)  # the LR of the step it resumes at
    # Compiled after DDP/FSDP wrapping; the wrapped model stays what validation and
    # checkpoints use.
    run.steps = training_steps(run.model, run.config.train.compile, ctx.rank)
    run.profiler = profiler_for(int(settings.get("profile_steps") or 0), ctx.rank)
    run.last_lr = run.optimizer.param_groups[0]["lr"]
    for epoch in range(start.epoch, run.max_epochs):
        metrics = _run_epoch(run, epoch, start if epoch == start.epoch else Start(epoch))
        if not run.total_steps:  # the fallback's per-epoch schedule
            run.scheduler.step()
        run.history.append(metrics)
        ctx.report(metrics, checkpoint_state(run, epoch + 1, metrics=metrics))
    return run


def _distribute(run: _Run, ctx: LoopContext) -> None:
    """The model wrapped for the worker's ``train.strategy``; DeepSpeed's engine takes over the
    optimizer too, and FSDP's flat shards get an optimizer of their own."""
    if ctx.strategy == "deepspeed":
        run.model, run.optimizer = deepspeed_engine.initialize(
            run.model, run.optimizer, run.config.train, run.micro_rows, ctx.world_size
        )
        return
    run.model = ctx.prepare_model(run.model)
    if sharding.is_sharded(run.model):
        scheduler_state = run.scheduler.state_dict()
        run.optimizer, run.scheduler = optimizer_and_schedule(
            run.model, run.config.train, run.max_epochs, run.total_steps
        )
        run.scheduler.load_state_dict(scheduler_state)


def _build_run(settings: dict[str, Any], ctx: LoopContext) -> _Run:
    """The model, optimizer and LR schedule from the settings, seeded for this rank."""
    config = validate_config(settings["pipeline"])
    spec = FeatureSpec.from_dict(settings["spec"])
    max_epochs = int(settings["max_epochs"])
    train = config.train
    train_rows = (settings.get("split_rows") or {}).get("train")
    seed_everything(train.seed + ctx.rank)
    model = build_model(
        config.model, spec.input_shape, spec.num_outputs, spec.task, spec.cardinalities, spec.tokens
    )
    steps = total_steps(train, max_epochs, train_rows)
    optimizer, scheduler = optimizer_and_schedule(model, train, max_epochs, steps)
    # The global batch is split across workers so results do not depend on the worker count.
    batch_rows, micro_rows = step_plan(
        train.batch_size, ctx.world_size, int(settings.get("max_workers", 1))
    )
    # train.grad_accum_steps: at least that many micro-batches per optimizer step.
    micro_rows = min(micro_rows, math.ceil(batch_rows / train.grad_accum_steps))
    if train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return _Run(
        ctx,
        config,
        spec,
        max_epochs,
        model,
        optimizer,
        scheduler,
        every_n_batches=int(settings.get("every_n_batches") or 0),
        batch_rows=batch_rows,
        micro_rows=micro_rows,
        loss_fn=_loss_fn(spec),
        model_config=checkpoint_model_config(config.model, model),
        steps_per_epoch=steps_per_epoch(train, train_rows),
        total_steps=steps,
        eval_every_steps=int(settings.get("eval_every_steps") or 0),
    )


def _loss_fn(spec: FeatureSpec) -> nn.Module:
    """The summed loss of the task: cross-entropy of classes, squared error, next token."""
    if spec.task == "causal_lm":
        return NextTokenLoss()
    return SquaredError() if spec.is_regression else nn.CrossEntropyLoss(reduction="sum")


class SquaredError(nn.Module):
    """A regression's loss: the summed squared error of the one output column against the
    (normalised) label."""

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output.squeeze(1), target.float(), reduction="sum")


def _run_epoch(run: _Run, epoch: int, start: Start) -> dict[str, float]:
    """Train and validate one epoch; its metrics (the LR is the one it trained with)."""
    torch.manual_seed(epoch_seed(run.config.train.seed, epoch, run.ctx.rank))
    train_loss, throughput = _train_epoch(run, epoch, start)
    val = _validate(run)
    val_loss = val["val_loss"]
    if not math.isfinite(train_loss) or not math.isfinite(val_loss):
        raise TrainingDivergedError(
            f"training diverged at epoch {epoch + 1}: train_loss={train_loss}, "
            f"val_loss={val_loss} (lr={run.config.train.lr:g}); lower train.lr or the sweep's "
            "train.lr range"
        )
    return {
        "epoch": epoch + 1,
        "train_loss": train_loss,
        **val,
        "lr": run.last_lr,
        # Elastic groups change size between attempts: the history shows each epoch's.
        "workers": float(run.ctx.world_size),
        **throughput,
    }


def _train_epoch(run: _Run, epoch: int, start: Start) -> tuple[float, dict[str, float]]:
    """One epoch from batch ``start.batch`` on; the mean train loss over all ranks and the
    epoch's throughput (``training.loop.throughput``)."""
    run.model.train()
    clock = EpochClock()
    totals = torch.zeros(2, dtype=torch.float64)  # loss sum, rows
    if start.partial is not None and run.ctx.rank == 0:  # once: the all-reduce sums ranks
        totals += torch.tensor(start.partial, dtype=torch.float64)
    bf16 = run.config.train.precision == "bf16"
    batches = clock.batches(run.ctx.train_batches(epoch, run.batch_rows, start.batch))
    for done, (features, labels) in enumerate(batches, start=start.batch + 1):
        run.optimizer.zero_grad(set_to_none=True)
        if run.spec.task == "causal_lm":  # the targets are the ids, shifted by the loss
            labels, units = features, target_count(features)
        else:
            units = len(labels)
        step = functools.partial(
            accumulate_gradients,
            loss_fn=run.loss_fn,
            features=features,
            labels=labels,
            micro=run.micro_rows,
            bf16=bf16,
            units=units,
        )
        loss_sum = _forward_backward(run, step)
        _optimizer_step(run)
        totals += torch.tensor([loss_sum, units], dtype=torch.float64)
        clock.trained(units)
        if run.every_n_batches and done % run.every_n_batches == 0:
            mid_epoch_checkpoint(run, epoch, done, totals)
    throughput = clock.metrics(run.ctx.all_reduce_sum, tokens=run.spec.task == "causal_lm")
    totals = run.ctx.all_reduce_sum(totals)
    return float(totals[0] / max(totals[1].item(), 1.0)), throughput


def _forward_backward(run: _Run, step) -> float:
    """``step`` (the batch's forward and backward passes) with the model, or compiled."""
    if run.steps is None:
        return step(run.model)
    return run.steps.run(step, reset=lambda: run.optimizer.zero_grad(set_to_none=True))


def _optimizer_step(run: _Run) -> None:
    """The optimizer's step, the next step's LR, and what runs every few steps."""
    run.last_lr = run.optimizer.param_groups[0]["lr"]
    run.optimizer.step()
    run.global_step += 1
    if run.total_steps:
        run.scheduler.step()
    validate_if_due(run)
    if run.profiler is not None:
        run.profiler.step()


def accumulate_gradients(
    model,
    loss_fn,
    features: torch.Tensor,
    labels: torch.Tensor,
    micro: int,
    bf16: bool = False,
    units: int | None = None,
) -> float:
    """Backward over the batch in micro-batches of at most ``micro`` rows; returns the loss sum.

    Each micro-batch's summed loss is divided by the whole batch's ``units`` (its rows, or a
    language model's next-token targets), so the accumulated gradient equals one pass over the
    whole batch. DDP all-reduces once, on the last one.
    """
    rows, loss_total = len(labels), 0.0
    units = rows if units is None else max(int(units), 1)
    # DeepSpeed's engine reduces in its own backward (and its step ends the accumulation).
    engine = deepspeed_engine.is_engine(model)
    backward = model.backward if engine else torch.Tensor.backward
    for start in range(0, rows, micro):
        last = start + micro >= rows
        no_sync = None if engine else getattr(model, "no_sync", None)
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with torch.autocast(features.device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(features[start : start + micro])
            loss = loss_fn(logits.float(), labels[start : start + micro])
            backward(loss / units)
        loss_total += loss.item()
    return loss_total
