"""What a sweep came to: each trial's fate and history, and the best healthy trial."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from training.config import PipelineConfig
from training.errors import TrainflowError, one_line
from training.loop.failures import contract_error
from training.metrics import EPOCH_METRICS, gain


@dataclass
class TrialSummary:
    """One trial: its parameters, how it ended, its last metrics and its per-epoch history."""

    trial_id: str
    params: dict[str, Any]
    status: str  # completed | stopped-early | errored
    epochs: int
    metrics: dict[str, float]
    error: str | None = None
    # One row per reported epoch: {"epoch", "train_loss", "val_loss", "val_accuracy"} (a
    # regression: val_rmse, val_mae, val_r2 for val_accuracy).
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class SweepOutcome:
    """The whole sweep: every trial, the best healthy one, and the epochs spent of the budget."""

    best_trial_id: str | None
    best_params: dict[str, Any]
    best_metric: float | None
    metric: str
    trials: list[TrialSummary] = field(default_factory=list)
    epochs_spent: int = 0
    epochs_budget: int = 0
    searcher: str = "random"  # sweep.searcher: random | optuna

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(grid, config: PipelineConfig) -> SweepOutcome:
    """Each trial's fate, and the best healthy trial (errored trials can never win)."""
    sweep = config.sweep
    keys = list(sweep.search_space)
    trials: list[TrialSummary] = []
    for result in grid:
        broken = contract_error(result.error)
        if broken is not None:  # the user's function breaks it in every trial: stop here
            raise broken
        metrics = result.metrics or {}
        epochs = int(metrics.get("training_iteration", 0) or 0)
        if result.error is not None:
            status = "errored"
        elif epochs < sweep.asha.max_t:
            status = "stopped-early"
        else:
            status = "completed"
        trials.append(
            TrialSummary(
                trial_id=str(metrics.get("trial_id") or result.path.rsplit("/", 1)[-1]),
                params={k: (result.config or {}).get(k) for k in keys},
                status=status,
                epochs=epochs,
                metrics={
                    k: float(metrics[k])
                    for k in EPOCH_METRICS
                    if isinstance(metrics.get(k), int | float)
                },
                error=one_line(result.error, 300, last=True) if result.error is not None else None,
                history=trial_history(result),
            )
        )
    healthy = [t for t in trials if t.status != "errored" and sweep.metric in t.metrics]
    outcome = SweepOutcome(
        best_trial_id=None,
        best_params={},
        best_metric=None,
        metric=sweep.metric,
        trials=trials,
        epochs_spent=sum(t.epochs for t in trials),
        epochs_budget=sweep.num_samples * sweep.asha.max_t,
        searcher=sweep.searcher,
    )
    if not healthy:
        reasons = "; ".join(sorted({t.error or "no metrics" for t in trials}))[:500]
        raise TrainflowError(
            f"all {len(trials)} sweep trials failed ({reasons}); fix the cause above or narrow "
            "sweep.search_space"
        )
    # The gain over zero orders scores whichever way the sweep's mode runs.
    best = max(healthy, key=lambda t: gain(t.metrics[sweep.metric], 0.0, sweep.mode))
    outcome.best_trial_id = best.trial_id
    outcome.best_params = best.params
    outcome.best_metric = best.metrics[sweep.metric]
    return outcome


_HISTORY_KEYS = EPOCH_METRICS


def trial_history(result) -> list[dict[str, float]]:
    """Per-epoch metrics of a trial from its progress file (``result.metrics_dataframe``):
    one row per ``training_iteration`` (the last wins, should a resumed trial repeat one)."""
    frame = getattr(result, "metrics_dataframe", None)
    if frame is None or "training_iteration" not in frame:
        return []
    rows: dict[int, dict[str, float]] = {}
    for record in frame.to_dict("records"):
        try:
            epoch = int(record["training_iteration"])
        except (TypeError, ValueError):
            continue
        row: dict[str, float] = {"epoch": epoch}
        for key in _HISTORY_KEYS:
            value = record.get(key)
            if isinstance(value, int | float) and value == value:  # not NaN
                row[key] = float(value)
        rows[epoch] = row
    return [rows[epoch] for epoch in sorted(rows)]
