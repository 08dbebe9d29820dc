"""What a final training's rank 0 returns from its worker: the per-epoch history, and with
``train.eval_every_steps`` / ``train.profile`` the step validations and the profile; and how the
train stage logs the last two to its MLflow run.

They travel as the worker's return value (Ray Train hands rank 0's to ``Result.return_value``),
as the history always has: small, no file shared between a worker's node and the driver's
needed. A test's or benchmark's own ``train_fn`` may still return the bare history.
"""

from __future__ import annotations

from typing import Any

from training.loop.profiling import log_profile
from training.loop.step_eval import log_step_metrics


def worker_result(
    history: list[dict[str, float]],
    step_metrics: list[dict[str, float]],
    profile: dict[str, Any] | None,
) -> dict[str, Any]:
    return {"history": history, "step_metrics": step_metrics, "profile": profile}


def unpack(
    value: Any,
) -> tuple[list[dict[str, float]], list[dict[str, float]], dict[str, Any] | None]:
    """(history, step metrics, profile) from a worker's return value (or a bare history)."""
    if isinstance(value, dict):
        return list(value["history"]), list(value["step_metrics"]), value["profile"]
    return list(value or []), [], None


def log_loop_records(tracker, run_id: str, outcome) -> None:
    """The step validations and the profile of a ``TrainOutcome``, into ``run_id``."""
    if outcome.step_metrics:
        log_step_metrics(tracker, run_id, outcome.step_metrics)
    log_profile(tracker, run_id, outcome.profile)
