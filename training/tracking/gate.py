"""The promotion gate: may a new model version take the champion alias? A pure decision.

No MLflow and no I/O here: :mod:`training.tracking.registry` reads the champion, asks
:func:`decide`, and moves the aliases and writes :func:`version_tags` as it answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from training.metrics import direction, gain

FIRST_MODEL = "first-model"  # there was no champion
PROMOTED = "promoted"  # better than the champion by more than min_delta, or it had no value
KEPT_CHAMPION = "kept-champion"  # not better enough: the champion stays

# What the gate writes on each version it decides on (and reads back from the champion).
METRIC_TAG = "gate.metric"
VALUE_TAG = "gate.value"
CHAMPION_VALUE_TAG = "gate.champion_value"
PREVIOUS_TAG = "gate.previous_champion"
DECISION_TAG = "gate.decision"


@dataclass(frozen=True)
class Champion:
    """The version that holds the champion alias, with its tags (its own ``gate.*`` among them)."""

    version: str
    tags: Mapping[str, str]


@dataclass(frozen=True)
class Decision:
    """The gate's answer for one challenger.

    ``champion_value``: the champion's value it was compared with (None: no champion, or one
    without a value for the gate's metric); ``previous``: the champion before this decision;
    ``repeated``: the challenger already is the champion (a retried promotion), so this is the
    decision it won then and nothing is to be written again.
    """

    decision: str
    champion_value: float | None
    previous: str | None
    repeated: bool = False

    @property
    def takes_champion(self) -> bool:
        return self.decision != KEPT_CHAMPION


def _float_or_none(value: str | None) -> float | None:
    try:
        result = float(value) if value is not None else None
    except ValueError:
        return None
    return result if result is not None and math.isfinite(result) else None


def _version_or_none(value: str | None) -> str | None:
    return None if value in (None, "", "none") else value


def decide(
    metric: str, min_delta: float, version: str, value: float, champion: Champion | None
) -> Decision:
    """Compare challenger ``version`` (``value`` of ``metric``) with the current ``champion``.

    The challenger wins when it beats the champion's value by more than ``min_delta``, in the
    metric's direction (losses lower, the others higher). A champion without a value for the
    same metric cannot be compared and is replaced.
    """
    if champion is None:
        return Decision(FIRST_MODEL, None, None)
    if str(champion.version) == str(version):
        tags = champion.tags
        return Decision(
            tags.get(DECISION_TAG, PROMOTED),
            _float_or_none(tags.get(CHAMPION_VALUE_TAG)),
            _version_or_none(tags.get(PREVIOUS_TAG)),
            repeated=True,
        )
    previous = str(champion.version)
    champion_value = None
    if champion.tags.get(METRIC_TAG) == metric:
        champion_value = _float_or_none(champion.tags.get(VALUE_TAG))
    if champion_value is None:
        return Decision(PROMOTED, None, previous)
    better_by = gain(float(value), champion_value, direction(metric))
    return Decision(PROMOTED if better_by > min_delta else KEPT_CHAMPION, champion_value, previous)


def version_tags(metric: str, value: float, decision: Decision) -> dict[str, str]:
    """The ``gate.*`` tags of the challenger: what it was judged on and what was decided."""
    champion_value = decision.champion_value
    return {
        METRIC_TAG: metric,
        VALUE_TAG: repr(float(value)),
        CHAMPION_VALUE_TAG: "none" if champion_value is None else repr(champion_value),
        PREVIOUS_TAG: decision.previous or "none",
        DECISION_TAG: decision.decision,
    }
