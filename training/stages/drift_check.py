"""The preprocess stage's drift check: the new training split (its spec's reference) against
the champion's, per column, logged on the pipeline's parent run and said on the console when a
column moved; the gate weighs it at promotion (``mlflow.gate.max_drift``)."""

from __future__ import annotations

import logging
import re

from training import progress
from training.config import PipelineConfig, registered_model_name
from training.data import drift
from training.manifest import Manifest
from training.tracking.champion_reference import champion_reference
from training.tracking.runs import Tracker

log = logging.getLogger(__name__)

#: The drift table on the parent run.
DRIFT_TABLE = "drift.json"
#: Said on the console above this PSI when ``mlflow.gate.max_drift`` is unset (the usual
#: reading of PSI: below 0.1 small, 0.1-0.25 moderate, above 0.25 large).
NOTABLE_PSI = 0.25
#: Columns named on the console line.
NAMED = 3


def measure(
    config: PipelineConfig, tracker: Tracker, parent_run: str, manifest: Manifest
) -> drift.DriftReport | None:
    """The drift of the new training data from the champion's; None when there is nothing to
    compare (no champion, or no reference on either side: images, older champions)."""
    ours = manifest.spec.drift_reference
    if not ours:
        return None
    try:
        found = champion_reference(tracker, registered_model_name(config))
    except Exception as exc:  # an unreadable champion: the gate still scores it, or says why
        log.warning("drift: the champion's training reference was not read: %s", exc)
        progress.report("preprocess", f"drift not measured: the champion was not read ({exc})")
        return None
    if found is None or not found.reference:
        return None
    report = drift.DriftReport(found.version, drift.compare(found.reference, ours))
    _log(tracker, parent_run, report)
    limit = config.mlflow.gate.max_drift
    over = report.over(NOTABLE_PSI if limit is None else limit)
    if over:
        progress.report("preprocess", _line(report, over, limit), drifted=len(over))
    return report


def _log(tracker: Tracker, parent_run: str, report: drift.DriftReport) -> None:
    """Every column's PSI as a metric ``drift_psi.<column>`` and the whole table."""
    metrics = {f"drift_psi.{_metric_key(d.column)}": d.psi for d in report.columns}
    if report.columns:
        metrics["drift_max_psi"] = report.columns[0].psi
    tracker.log_metrics(parent_run, metrics)
    tracker.set_tags(parent_run, {"trainflow.drift.champion_version": report.champion_version})
    tracker.client.log_table(parent_run, report.table(), DRIFT_TABLE)


def _metric_key(column: str) -> str:
    return re.sub(r"[^\w\-. /]", "_", str(column))[:200]


def _line(report: drift.DriftReport, over: list[drift.ColumnDrift], limit: float | None) -> str:
    """``drift vs champion version 3's training data: 'x1' PSI 2.1, 'x2' PSI 0.4 (above
    max_drift 0.2; gate.on_drift decides)``"""
    named = ", ".join(f"{d.column!r} PSI {d.psi:.3g}" for d in over[:NAMED])
    more = f" and {len(over) - NAMED} more" if len(over) > NAMED else ""
    why = (
        f"above mlflow.gate.max_drift {limit:g}"
        if limit is not None
        else f"above {NOTABLE_PSI:g}; mlflow.gate.max_drift is unset: not judged"
    )
    return (
        f"drift vs champion version {report.champion_version}'s training data: {named}{more} "
        f"({why}; table {DRIFT_TABLE})"
    )
