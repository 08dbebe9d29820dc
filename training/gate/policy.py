"""The promotion gate: may a new model version take the champion alias? A pure decision.

No MLflow and no I/O here: :mod:`training.tracking.registry` reads the champion, asks
:func:`decide`, and moves the aliases and writes :func:`version_tags` as it answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from training.gate.stats import Paired
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
REASON_TAG = "gate.reason"
RECORD_TAG = "gate.record"  # the GateRecord as JSON


@dataclass(frozen=True)
class Champion:
    """The version that holds the champion alias, with its tags (its own ``gate.*`` among them)."""

    version: str
    tags: Mapping[str, str]


@dataclass(frozen=True)
class GateRecord:
    """What the gate weighed and why, as logged (MLflow table, version tags, console):
    both models' ``metric`` on the same ``rows``, the improvement and its interval at
    ``confidence``, the slices that dropped, the verdict and its reason."""

    metric: str
    verdict: str
    reason: str
    challenger_version: str
    champion_version: str | None = None
    champion: float | None = None
    challenger: float | None = None
    difference: float | None = None
    interval: tuple[float, float] | None = None
    confidence: float | None = None
    rows: int | None = None
    rule: str = "interval"
    slices: list[dict] = field(default_factory=list)
    drift: list[dict] = field(default_factory=list)  # columns drifted beyond gate.max_drift

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=str)

    def table(self) -> dict[str, list]:
        """One row, columns as ``mlflow.log_table`` takes them (slices as JSON text)."""
        row = {**self.to_dict(), "slices": json.dumps(self.slices, default=str)}
        row["drift"] = json.dumps(self.drift, default=str)
        row["interval"] = json.dumps(self.interval)
        return {key: [value] for key, value in row.items()}

    @property
    def headline(self) -> str:
        """``accuracy 0.981 vs champion 0.975 on the same 360 rows, +0.6 [+0.1, +1.2] at 95%``
        (differences in points of a 0-1 metric, in the metric's unit otherwise)."""
        if self.champion is None or self.challenger is None or self.rows is None:
            return self.reason
        name = self.metric.removeprefix("test_")
        scale = 100.0 if name in ("accuracy", "macro_f1", "r2") else 1.0
        text = (
            f"{name} {self.challenger:.4g} vs champion {self.champion:.4g} on the same "
            f"{self.rows} rows, {scale * (self.difference or 0.0):+.3g}"
        )
        if self.interval is not None and self.confidence is not None:
            low, high = self.interval
            text += f" [{scale * low:+.3g}, {scale * high:+.3g}] at {self.confidence:.0%}"
        return f"{text}; {self.reason}" if self.reason else text


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
    record: GateRecord | None = None

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


@dataclass(frozen=True)
class Rules:
    """The gate's settings (``mlflow.gate``), as the pure decision takes them."""

    metric: str
    min_delta: float = 0.0
    rule: str = "interval"  # interval: the interval's lower bound must beat min_delta
    confidence: float = 0.95
    samples: int = 1000
    seed: int = 0
    max_slice_drop: float | None = 0.1
    min_slice_rows: int = 20
    on_incompatible: str = "promote"


def same_rows(
    rules: Rules,
    version: str,
    champion_version: str,
    labels,
    challenger,
    champion,
    columns: Mapping[str, object] | None = None,
) -> Decision:
    """Decide on both models' predictions of the same rows (labels, challenger's and
    champion's predictions, and the raw values of each slice column)."""
    from training.gate.stats import paired_bootstrap, slice_drops

    paired = paired_bootstrap(
        rules.metric, labels, challenger, champion, rules.confidence, rules.samples, rules.seed
    )
    drops = slice_drops(
        rules.metric,
        labels,
        challenger,
        champion,
        columns,
        rules.max_slice_drop,
        rules.min_slice_rows,
    )
    return judge(rules, version, champion_version, paired, drops)


def judge(
    rules: Rules, version: str, champion_version: str, paired: Paired, drops: list[dict]
) -> Decision:
    """Promote when the improvement (``point``) or its interval's lower bound (``interval``)
    is above ``min_delta`` and no slice dropped by more than ``max_slice_drop``."""
    measured = paired.low if rules.rule == "interval" else paired.difference
    what = "the interval's lower bound" if rules.rule == "interval" else "the improvement"
    if drops:
        verdict = KEPT_CHAMPION
        named = ", ".join(f"{d['slice']} {d['change']:+.3g}" for d in drops[:5])
        reason = f"slices dropped more than {rules.max_slice_drop:g}: {named}"
    elif measured > rules.min_delta:
        verdict, reason = PROMOTED, f"{what} {measured:+.4g} > min_delta {rules.min_delta:g}"
    else:
        verdict, reason = KEPT_CHAMPION, f"{what} {measured:+.4g} <= min_delta {rules.min_delta:g}"
    record = GateRecord(
        metric=rules.metric,
        verdict=verdict,
        reason=reason,
        challenger_version=str(version),
        champion_version=str(champion_version),
        champion=paired.champion,
        challenger=paired.challenger,
        difference=paired.difference,
        interval=(paired.low, paired.high),
        confidence=paired.confidence,
        rows=paired.rows,
        rule=rules.rule,
        slices=drops,
    )
    return Decision(verdict, paired.champion, str(champion_version), record=record)


def incompatible(rules: Rules, version: str, champion_version: str, why: str) -> Decision:
    """The champion cannot score the challenger's rows (columns gone, other classes, a model
    that does not load): ``on_incompatible`` decides, and the record says why."""
    verdict = PROMOTED if rules.on_incompatible == "promote" else KEPT_CHAMPION
    reason = (
        f"the champion cannot score the new rows ({why}); on_incompatible={rules.on_incompatible}"
    )
    record = GateRecord(
        rules.metric, verdict, reason, str(version), str(champion_version), rule=rules.rule
    )
    return Decision(verdict, None, str(champion_version), record=record)


def version_tags(metric: str, value: float, decision: Decision) -> dict[str, str]:
    """The ``gate.*`` tags of the challenger: what it was judged on and what was decided."""
    champion_value = decision.champion_value
    return {
        METRIC_TAG: metric,
        VALUE_TAG: repr(float(value)),
        CHAMPION_VALUE_TAG: "none" if champion_value is None else repr(champion_value),
        PREVIOUS_TAG: decision.previous or "none",
        DECISION_TAG: decision.decision,
        **(_record_tags(decision.record) if decision.record is not None else {}),
    }


def _record_tags(record: GateRecord) -> dict[str, str]:
    """The record on the version: its reason, and the whole record as JSON (an MLflow tag
    holds 5,000 characters: slices are cut to fit)."""
    text = record.to_json()
    if len(text) > 4900:
        cut = {"slices": record.slices[:3], "drift": record.drift[:3]}
        text = GateRecord(**{**record.to_dict(), **cut}).to_json()[:4900]
    return {REASON_TAG: record.reason[:4900], RECORD_TAG: text}
