"""The champion scored on the challenger's test rows, through the registered pyfunc (the same
path as every other score), and the gate's record logged: the MLflow side of the gate."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from training.gate.policy import GateRecord
from training.tracking import flavour
from training.tracking.runs import Tracker

log = logging.getLogger(__name__)

DECISION_TABLE = "gate_decision.json"
PREDICTIONS_TABLE = "gate_predictions.json"


@dataclass(frozen=True)
class ChampionScore:
    """The champion's predictions of the rows, or why it could not make them."""

    predictions: np.ndarray | None
    refused: str | None = None


def score_champion(
    config: Any, name: str, version: str, rows: pd.DataFrame, classes: list[Any]
) -> ChampionScore:
    """``models:/NAME/VERSION`` resolved, loaded and asked to predict ``rows`` (raw, with the
    label column, as evaluation scores them). A champion that does not load, knows other
    classes (or the other task) or refuses the rows' columns is refused, with the reason."""
    try:
        packed = flavour.resolve(config, f"models:/{name}/{version}")
    except Exception as exc:  # a deleted artifact, an unreadable state: the reason is the point
        return ChampionScore(None, f"version {version} does not load: {_short(exc)}")
    if [str(c) for c in packed.classes] != [str(c) for c in classes]:
        return ChampionScore(
            None,
            f"version {version} knows classes {packed.classes[:10]} but the new data has "
            f"{list(classes)[:10]}",
        )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = flavour.load_model(packed.files, tmp, "cpu")
            scored = flavour.predict(model, rows)
    except Exception as exc:
        return ChampionScore(None, f"version {version} refused the rows: {_short(exc)}")
    return ChampionScore(scored[flavour.PREDICTION].to_numpy())


def _short(exc: BaseException) -> str:
    return flavour.refusal(exc)[:300]


def log_decision(
    tracker: Tracker,
    run_id: str,
    record: GateRecord,
    labels: np.ndarray | None = None,
    challenger: np.ndarray | None = None,
    champion: np.ndarray | None = None,
) -> None:
    """The record as an MLflow table (``gate_decision.json``), both models' metric on the
    same rows as metrics, and both predictions row by row (``gate_predictions.json``)."""
    tracker.client.log_table(run_id, record.table(), DECISION_TABLE)
    if record.champion is not None and record.challenger is not None:
        name = record.metric.removeprefix("test_")
        scores = {f"gate_champion_{name}": record.champion}
        scores[f"gate_challenger_{name}"] = record.challenger
        tracker.log_metrics(run_id, scores)
    if labels is not None and challenger is not None and champion is not None:
        table = {
            "label": np.asarray(labels).tolist(),
            "challenger": np.asarray(challenger).tolist(),
            "champion": np.asarray(champion).tolist(),
        }
        tracker.client.log_table(run_id, table, PREDICTIONS_TABLE)
