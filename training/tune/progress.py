"""The sweep's progress, from Tune's own callback hooks in the driver: trials finished, stopped
early, errored and running, and the best metric so far."""

from __future__ import annotations

from typing import Any

from ray import tune

from training import progress
from training.metrics import gain


class SweepProgress(tune.Callback):
    """Reports a progress event whenever a trial ends or the best value improves."""

    def __init__(
        self, metric: str, mode: str, num_samples: int, max_t: int, sample: str = ""
    ) -> None:
        self.metric, self.mode = metric, mode
        self.sample = sample  # e.g. "; trials on 10,000 of 139,818 train rows" (sample_rows)
        self.num_samples, self.max_t = num_samples, max_t
        self.best: float | None = None
        self.best_trial: str | None = None
        # Each trial's latest value: the sweep's outcome ranks trials by their last result
        # (training/tune/outcome.py), so the console's "best so far" does too.
        self.latest: dict[str, float] = {}
        self.ended: dict[str, str] = {}  # trial id -> completed | stopped-early | errored

    def on_trial_result(self, iteration: int, trials: list, trial, result: dict, **info: Any):
        value = result.get(self.metric)
        if not isinstance(value, int | float) or value != value:  # missing or NaN
            return
        self.latest[trial.trial_id] = float(value)
        leader = max(self.latest, key=lambda t: gain(self.latest[t], 0.0, self.mode))
        best, best_trial = self.latest[leader], _short(leader)
        if (best, best_trial) != (self.best, self.best_trial):
            self.best, self.best_trial = best, best_trial
            self._report(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial, **info: Any):
        epochs = int((trial.last_result or {}).get("training_iteration", 0) or 0)
        self.ended[trial.trial_id] = "completed" if epochs >= self.max_t else "stopped-early"
        self._report(trials)

    def on_trial_error(self, iteration: int, trials: list, trial, **info: Any):
        self.ended[trial.trial_id] = "errored"
        self._report(trials)

    def _report(self, trials: list) -> None:
        fates = list(self.ended.values())
        # The trial that just ended may still read RUNNING here.
        running = sum(1 for t in trials if t.status == "RUNNING" and t.trial_id not in self.ended)
        counts = {fate: fates.count(fate) for fate in ("completed", "stopped-early", "errored")}
        best = (
            f"best {self.metric} {self.best:.4f} ({self.best_trial})"
            if self.best is not None
            else "no result yet"
        )
        progress.report(
            "sweep",
            f"{len(fates)}/{self.num_samples} trials done ({counts['stopped-early']} stopped "
            f"early, {counts['errored']} errored), {running} running; {best}{self.sample}",
            done=len(fates),
            total=self.num_samples,
            running=running,
            best=self.best,
            best_trial=self.best_trial,
            metric=self.metric,
            **{fate.replace("-", "_"): n for fate, n in counts.items()},
        )


def _short(trial_id: str) -> str:
    """``f3f1c_00003`` -> ``trial 03``: the counter Tune puts at the end of every trial id."""
    tail = str(trial_id).rsplit("_", 1)[-1]
    return f"trial {int(tail):02d}" if tail.isdigit() else f"trial {trial_id}"
