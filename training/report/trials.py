"""Sweep trials in tables and plots: which values a plot can place, how a value reads in a cell,
and which keys were swept. Trial names and fates come from :mod:`training.tune.trials`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from training.metrics import is_count

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


def fmt_metric(value: Any, name: str) -> str:
    """A named value in a table: a count (:func:`training.metrics.is_count`) as a whole number
    with thousands separators, as the summary's row counts read; anything else as :func:`fmt`."""
    if is_count(name) and is_number(value) and float(value).is_integer():
        return f"{int(value):,}"
    return fmt(value)


def swept_params(trials: Iterable[TrialSummary]) -> list[str]:
    """Every swept key, in the order the trials first show it."""
    params: list[str] = []
    for trial in trials:
        params += [k for k in trial.params or {} if k not in params]
    return params
