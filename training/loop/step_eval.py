"""``train.eval_every_steps``: the final training also validates every N optimizer steps.

The epoch's own validation path (``training.loop.validation``) runs on every rank (its sums are
all-reduced), at the same global step everywhere: DDP's ranks step in lockstep. The rows stay in
the loop (and its checkpoints, so a restart keeps the ones before it) and reach MLflow after
training, as the per-epoch history does, named ``step/<metric>`` at MLflow's ``step`` = the global
optimizer step: Tune's reports stay one per epoch, which ASHA counts as its iterations, and the
per-epoch ``val_loss`` series (step = epoch) is not mixed with these.
"""

from __future__ import annotations

from typing import Any

from training.loop.validation import validate

PREFIX = "step/"


def validate_if_due(run: Any) -> None:
    """Validate after this optimizer step if it is the N-th (``run``: the loop's ``_Run``)."""
    every = run.eval_every_steps
    if not every or run.global_step % every:
        return
    metrics = validate(run)
    run.model.train()
    run.step_metrics.append({"step": run.global_step, **metrics, "lr": run.last_lr})


def log_step_metrics(tracker, run_id: str, rows: list[dict[str, float]]) -> None:
    """The step rows as ``step/<metric>`` points of ``run_id`` at their optimizer step."""
    named = [
        {"step": row["step"], **{PREFIX + key: v for key, v in row.items() if key != "step"}}
        for row in rows
    ]
    tracker.log_history(run_id, named, step_key="step")
