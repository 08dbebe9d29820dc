"""The gate's drift rule, pure: a challenger trained on data that drifted beyond
``mlflow.gate.max_drift`` from the champion's training data is kept out (``on_drift: block``)
or promoted with a warning in its record (``warn``). The drift itself is measured in the
preprocess stage (``training.data.drift``) and arrives here as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from training.gate.policy import KEPT_CHAMPION, Decision, GateRecord

#: Drifted columns named in a reason (all of them are in the record).
NAMED = 5


def drifted(drift: Mapping[str, Any] | None, max_drift: float | None) -> list[dict]:
    """The columns whose PSI is above ``max_drift``, most drifted first ([]: none, or unset)."""
    if drift is None or max_drift is None:
        return []
    return [dict(c) for c in drift.get("columns", []) if c["psi"] > max_drift]


def drift_text(drift: Mapping[str, Any], over: list[dict], max_drift: float) -> str:
    """``the training data drifted from champion version 3's beyond max_drift 0.2: 'x' PSI 1.4``"""
    named = ", ".join(f"{c['column']!r} PSI {c['psi']:.3g}" for c in over[:NAMED])
    more = f" and {len(over) - NAMED} more" if len(over) > NAMED else ""
    return (
        f"the training data drifted from champion version {drift['champion_version']}'s beyond "
        f"max_drift {max_drift:g}: {named}{more}"
    )


def apply(
    decision: Decision,
    drift: Mapping[str, Any] | None,
    max_drift: float | None,
    on_drift: str,
    metric: str,
    version: str,
) -> Decision:
    """The decision once drift is weighed: unchanged when nothing drifted beyond ``max_drift``
    (or it is unset); else blocked or warned about, the drifted columns in its record."""
    over = drifted(drift, max_drift)
    if not over or decision.repeated:
        return decision
    what = drift_text(drift, over, max_drift)
    record = decision.record or GateRecord(
        metric, decision.decision, decision.decision, str(version), decision.previous
    )
    if on_drift == "block" and decision.takes_champion:
        reason = f"{what}; on_drift=block (it would have been: {record.reason})"
        record = replace(record, verdict=KEPT_CHAMPION, reason=reason, drift=over)
        return replace(decision, decision=KEPT_CHAMPION, record=record)
    outcome = "promoted anyway" if decision.takes_champion else "the champion stays anyway"
    reason = f"{record.reason}; {what}; on_drift={on_drift}: {outcome}"
    return replace(decision, record=replace(record, reason=reason, drift=over))
