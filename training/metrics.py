"""Which way a metric improves: the one rule every ranking, gate and checkpoint score uses."""

from __future__ import annotations

from typing import Literal

Mode = Literal["max", "min"]

# Errors and losses go down as a model gets better; every other metric (accuracy, F1, R²) goes up.
_LOWER_IS_BETTER = ("loss", "rmse", "mse", "mae")


def direction(metric: str) -> Mode:
    """``"min"`` for losses and errors (``val_loss``, ``test_rmse``), ``"max"`` otherwise."""
    name = metric.rsplit(".", 1)[-1].lower()
    return "min" if name.endswith(_LOWER_IS_BETTER) else "max"


def gain(new: float, old: float, mode: Mode) -> float:
    """How much better ``new`` is than ``old`` (negative: worse), whichever way ``mode`` runs."""
    return new - old if mode == "max" else old - new


def worst(mode: Mode) -> float:
    """A value every real score beats."""
    return float("-inf") if mode == "max" else float("inf")
