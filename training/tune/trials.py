"""Sweep trials in words: readable run names ("trial 03 · lr=0.0031 bs=64"), how each trial
ended (the ASHA rung that stopped it), and the share of the epoch budget ASHA saved."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.config import AshaConfig
    from training.tune.outcome import SweepOutcome, TrialSummary

# Short names of swept keys in run names ("trial 03 · lr=0.0031 bs=64").
PARAM_ABBREVIATIONS = {"batch_size": "bs", "weight_decay": "wd", "hidden_sizes": "hidden"}
FATES = ("completed", "stopped-early", "errored")
MAX_RUN_NAME = 250


def format_value(value: Any) -> str:
    """Two significant digits for floats (0.0031, 1.5e-05), lists as 128x64."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) >= 100 else f"{value:.2g}"
    if isinstance(value, list | tuple):
        return "x".join(format_value(v) for v in value)
    return str(value)


def trial_number(trial_id: str) -> int | None:
    """Tune's trial ids end in a counter: ``f3f1c_00003`` -> 3."""
    tail = str(trial_id).rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def short_param(key: str) -> str:
    name = str(key).rsplit(".", 1)[-1]
    return PARAM_ABBREVIATIONS.get(name, name)


def trial_run_name(trial_id: str, params: Mapping[str, Any], width: int = 2) -> str:
    """``trial 03 · lr=0.0031 bs=64``: the trial's number and its sampled values."""
    number = trial_number(trial_id)
    head = f"trial {number:0{width}d}" if number is not None else f"trial {trial_id}"
    values = " ".join(f"{short_param(k)}={format_value(v)}" for k, v in params.items())
    return (f"{head} · {values}" if values else head)[:MAX_RUN_NAME]


def number_width(num_samples: int) -> int:
    return max(2, len(str(max(int(num_samples) - 1, 0))))


def asha_milestones(max_t: int, grace_period: int, reduction_factor: float) -> list[int]:
    """The iterations at which ASHA compares a trial with its peers (its rungs), ascending.

    Mirrors Ray's ``_Bracket`` (one bracket): ``grace_period * reduction_factor**k`` for
    ``k < int(log(max_t / grace_period) / log(reduction_factor)) + 1``; results are integer
    iterations, so a fractional milestone is reached at the next whole iteration.
    """
    if max_t < 1 or grace_period < 1 or reduction_factor <= 1:
        return []
    rungs = int(math.log(max_t / grace_period) / math.log(reduction_factor) + 1)
    milestones = {
        math.ceil(round(grace_period * reduction_factor**k, 9)) for k in range(max(rungs, 0))
    }
    return sorted(m for m in milestones if m <= max_t)


def milestones_of(asha: AshaConfig) -> list[int]:
    """The rungs of the sweep's ASHA settings (``sweep.asha``)."""
    return asha_milestones(asha.max_t, asha.grace_period, asha.reduction_factor)


def rung_of(iteration: int, milestones: Sequence[int]) -> int | None:
    """1-based rung number of an iteration at which ASHA compares trials, else None."""
    return milestones.index(iteration) + 1 if iteration in milestones else None


def fate_detail(
    status: str, epochs: int, max_t: int, milestones: Sequence[int], error: str | None = None
) -> str:
    """How a trial ended, in words: "stopped by ASHA at rung 2 (iteration 2 of 3)"."""
    if status == "completed":
        return f"completed all {epochs} iterations"
    if status == "errored":
        return f"errored at iteration {epochs}: {error or 'unknown error'}"
    if status == "stopped-early":
        rung = rung_of(epochs, milestones)
        if rung is not None:
            return f"stopped by ASHA at rung {rung} (iteration {epochs} of {max_t})"
        return f"stopped early at iteration {epochs} of {max_t}"
    return status


@dataclass(frozen=True)
class TrialRow:
    """One trial of a sweep as the report shows it."""

    trial: TrialSummary
    name: str  # "trial 03 · lr=0.0031 bs=64"
    fate: str  # "stopped by ASHA at rung 2 (iteration 2 of 3)"
    rung: int | None  # the ASHA rung that stopped it, if one did
    best: bool


def trial_rows(sweep: SweepOutcome, asha: AshaConfig) -> list[TrialRow]:
    """The sweep's trials with their names, fates and rungs, in trial order."""
    milestones = milestones_of(asha)
    width = number_width(len(sweep.trials))
    rows = []
    for trial in sweep.trials:
        epochs = int(trial.epochs or 0)
        rows.append(
            TrialRow(
                trial=trial,
                name=trial_run_name(trial.trial_id, trial.params or {}, width),
                fate=fate_detail(trial.status, epochs, asha.max_t, milestones, trial.error),
                rung=rung_of(epochs, milestones) if trial.status == "stopped-early" else None,
                best=trial.trial_id == sweep.best_trial_id,
            )
        )
    return rows


def count_fates(trials: Iterable[TrialSummary]) -> dict[str, int]:
    """How many trials ended each way, in status name order (only the ways that occurred)."""
    statuses = [trial.status for trial in trials]
    return {status: statuses.count(status) for status in sorted(set(statuses))}


def sweep_saving(sweep: SweepOutcome) -> float | None:
    """The share of the full budget (num_samples x max_t epochs) that ASHA did not spend."""
    budget = sweep.epochs_budget or 0
    return 1 - (sweep.epochs_spent or 0) / budget if budget else None
