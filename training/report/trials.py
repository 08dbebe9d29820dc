"""Sweep trials in tables and plots: which values a plot can place, how a value reads in a cell,
and which keys were swept. Trial names and fates come from :mod:`training.tune.trials`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.tune.outcome import TrialSummary


def is_number(value: Any) -> bool:
    """A finite real number (not a bool): something a plot can place."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def fmt(value: Any) -> str:
    """A value in a table: four significant digits for floats, ``str`` for the rest."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def swept_params(trials: Iterable[TrialSummary]) -> list[str]:
    """Every swept key, in the order the trials first show it."""
    params: list[str] = []
    for trial in trials:
        params += [k for k in trial.params or {} if k not in params]
    return params
