"""The promote stage's judge: the champion scored on the rows the challenger was scored on, and
the pure gate asked about both (called by the registry under the promotion lock)."""

from __future__ import annotations

from typing import Any

import numpy as np

from training.config import PipelineConfig
from training.errors import ConfigError
from training.gate import drift as gate_drift
from training.gate import policy as gate
from training.manifest import FeatureSpec
from training.stages.evaluated import Evaluated
from training.tracking.champion_scoring import score_champion


def rules_of(config: PipelineConfig) -> gate.Rules:
    """``mlflow.gate`` as the pure gate takes it."""
    g = config.mlflow.gate
    return gate.Rules(
        metric=g.metric,
        min_delta=g.min_delta,
        rule=g.rule,
        confidence=g.confidence,
        samples=g.bootstrap_samples,
        seed=g.seed,
        max_slice_drop=g.max_slice_drop,
        min_slice_rows=g.min_slice_rows,
        on_incompatible=g.on_incompatible,
    )


class SameRows:
    """Judges a challenger against whichever version holds the champion alias when the lock is
    taken, on the test rows the evaluate stage scored (``evaluated``), then weighs the drift of
    its training data from the champion's (``drift``: a ``DriftReport`` as a dict, or None)."""

    def __init__(
        self,
        config: PipelineConfig,
        name: str,
        evaluated: Evaluated,
        drift: dict[str, Any] | None = None,
    ):
        self.config, self.name, self.evaluated, self.drift = config, name, evaluated, drift
        self.rules = rules_of(config)
        self.champion_predictions: np.ndarray | None = None
        rows = evaluated.test_rows
        wanted = config.mlflow.gate.slice_columns
        missing = [c for c in wanted if rows is not None and c not in rows]
        if missing:
            raise ConfigError(
                f"mlflow.gate.slice_columns names {missing}, which the data does not have; "
                f"columns: {sorted(rows.columns)[:20]}"
            )

    def judge(self, champion: gate.Champion, version: str) -> gate.Decision:
        """The decision on the same rows, with the drift rule (``mlflow.gate.max_drift``)."""
        g = self.config.mlflow.gate
        decision = self._on_rows(champion, version)
        return gate_drift.apply(decision, self.drift, g.max_drift, g.on_drift, g.metric, version)

    def _on_rows(self, champion: gate.Champion, version: str) -> gate.Decision:
        """The decision on the same rows; on the stored values when the rows were not kept
        (a test split too large for the driver)."""
        evaluated = self.evaluated
        if evaluated.test_rows is None or evaluated.predictions is None:
            return _stored_value(self.rules, version, champion, evaluated)
        classes = FeatureSpec.from_dict(evaluated.state["spec"]).classes
        score = score_champion(
            self.config, self.name, champion.version, evaluated.test_rows, classes
        )
        if score.predictions is None:
            return gate.incompatible(self.rules, version, champion.version, score.refused or "")
        self.champion_predictions = score.predictions
        columns = {
            c: evaluated.test_rows[c].to_numpy() for c in self.config.mlflow.gate.slice_columns
        }
        return gate.same_rows(
            self.rules,
            version,
            champion.version,
            evaluated.labels,
            evaluated.predictions,
            score.predictions,
            columns,
        )

    def logged(self) -> tuple:
        """Labels, challenger's and champion's predictions for the log (None: not scored)."""
        if self.champion_predictions is None:
            return None, None, None
        return self.evaluated.labels, self.evaluated.predictions, self.champion_predictions


def _stored_value(
    rules: gate.Rules, version: str, champion: gate.Champion, evaluated: Evaluated
) -> gate.Decision:
    """The old comparison with the value stored on the champion, said as such in the record."""
    value = evaluated.result.metrics[rules.metric]
    decision = gate.decide(rules.metric, rules.min_delta, version, value, champion)
    reason = (
        "the test split is too large to score both models in the driver: compared with the "
        "value stored on the champion (its own test rows)"
    )
    if evaluated.result.task == "causal_lm":
        reason = (
            "a language model has no per-row predictions: its test perplexity is compared "
            "with the value stored on the champion (the same test blocks when the data is)"
        )
    record = gate.GateRecord(
        rules.metric,
        decision.decision,
        reason,
        str(version),
        str(champion.version),
        champion=decision.champion_value,
        challenger=value,
        rule="point",
    )
    return gate.Decision(
        decision.decision, decision.champion_value, decision.previous, record=record
    )
