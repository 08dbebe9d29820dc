"""What a checkpoint keeps of a run of the loop, and where a run resumed from one continues.

``run``: the loop's ``_Run`` (``training.loop.loop``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training.loop import sharding
from training.metrics import worst


@dataclass
class Start:
    """Where training starts: epochs completed, and batches done in the next one (mid-epoch
    checkpoints) with the global loss totals over them."""

    epoch: int = 0
    batch: int = 0
    partial: list[float] | None = None


def resume(run: Any, state: dict[str, Any] | None) -> Start:
    """Load a checkpoint's state into the run (if any); where its training continues."""
    if state is None:
        return Start()
    run.model.load_state_dict(state["model"])  # the optimizer's state: after prepare_model
    run.scheduler.load_state_dict(state["scheduler"])
    run.history = list(state["history"])
    run.step_metrics = list(state.get("step_metrics", []))
    start = Start(int(state["epoch"]), int(state.get("batch", 0)), state.get("partial_totals"))
    run.global_step = int(state.get("global_step", start.epoch * run.steps_per_epoch + start.batch))
    if start.batch and state.get("world_size", run.ctx.world_size) != run.ctx.world_size:
        # An elastic resize changed every rank's shard: a batch position of the old split
        # means nothing in the new one, so the epoch restarts (its first part seen twice).
        start.batch, start.partial = 0, None
    if run.ctx.rank == 0:  # in the worker's log: a restart or re-run continued, not restarted
        print(
            f"trainflow: resuming at epoch {start.epoch + 1} of {run.max_epochs} from a checkpoint"
        )
    return start


def mid_epoch_checkpoint(run: Any, epoch: int, done: int, totals: torch.Tensor) -> None:
    """Report a checkpoint after ``done`` batches of ``epoch``, ranked below every real one."""
    # Every rank reaches this point together (equal shards); the summed partial loss lets
    # a resumed epoch report the same train_loss. The worst score keeps it from ever
    # ranking as "best"; Ray Train still resumes from it as the latest.
    totals = run.ctx.all_reduce_sum(totals)
    checkpoint = run.config.train.checkpoint
    extra = {"batch": done, "partial_totals": totals.tolist(), "world_size": run.ctx.world_size}
    metrics = {"epoch_in_progress": epoch + 1, "batch": done}
    metrics[checkpoint.score_attribute] = worst(checkpoint.score_order)
    run.ctx.report(metrics, checkpoint_state(run, epoch, **extra))


def checkpoint_state(run: Any, epoch: int, **extra: Any) -> dict[str, Any] | None:
    """What a checkpoint keeps after ``epoch`` epochs (rank 0 only: the others report None)."""
    # Full state dicts; under FSDP gathering them is a collective every rank joins.
    model_state = sharding.model_state(run.model, run.ctx.rank)
    optimizer_state = sharding.optimizer_state(run.model, run.optimizer, run.ctx.rank)
    if run.ctx.rank != 0:
        return None
    return {
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": run.scheduler.state_dict(),
        "epoch": epoch,
        "global_step": run.global_step,
        "history": list(run.history),  # a copy: in-process contexts keep the dict
        "step_metrics": list(run.step_metrics),
        "spec": run.spec.to_dict(),
        "model_config": run.model_config,
        **extra,
    }
