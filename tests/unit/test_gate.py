"""The promotion gate as a pure decision: no MLflow store, no server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from training.gate.policy import (
    FIRST_MODEL,
    KEPT_CHAMPION,
    PROMOTED,
    Champion,
    Decision,
    decide,
    version_tags,
)


def champion(version: str = "3", metric: str = "test_accuracy", value: float | str = 0.80):
    return Champion(version, {"gate.metric": metric, "gate.value": repr(value)})


def test_first_model_takes_the_champion_alias():
    decision = decide("test_accuracy", 0.0, "1", 0.5, None)
    assert decision == Decision(FIRST_MODEL, None, None)
    assert decision.takes_champion and not decision.repeated


# Binary fractions, so that "better by exactly min_delta" is exact in floating point.
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.75, PROMOTED),  # better by 0.25 > min_delta
        (0.626, PROMOTED),  # just past min_delta
        (0.625, KEPT_CHAMPION),  # better by exactly min_delta: not enough
        (0.6, KEPT_CHAMPION),  # better, but not by more than min_delta
        (0.5, KEPT_CHAMPION),  # equal
        (0.4, KEPT_CHAMPION),  # worse
    ],
)
def test_higher_is_better_needs_more_than_min_delta(value, expected):
    decision = decide("test_accuracy", 0.125, "4", value, champion("3", value=0.5))
    assert decision.decision == expected
    assert decision.champion_value == 0.5
    assert decision.previous == "3"
    assert decision.takes_champion == (expected == PROMOTED)


def test_zero_min_delta_still_keeps_an_equal_champion():
    held = champion(metric="test_macro_f1", value=0.7)
    assert decide("test_macro_f1", 0.0, "4", 0.7, held) == Decision(KEPT_CHAMPION, 0.7, "3")
    assert decide("test_macro_f1", 0.0, "4", 0.7001, held).decision == PROMOTED


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.25, PROMOTED), (0.375, KEPT_CHAMPION), (0.5, KEPT_CHAMPION), (0.75, KEPT_CHAMPION)],
)
def test_lower_is_better_for_a_loss(value, expected):
    decision = decide("test_loss", 0.125, "2", value, champion("1", "test_loss", 0.5))
    assert decision.decision == expected  # 0.375 is lower by exactly min_delta: kept
    assert decision.champion_value == 0.5


@pytest.mark.parametrize(
    "tags",
    [
        {},  # registered by hand: never went through the gate
        {"gate.metric": "test_loss", "gate.value": "0.1"},  # judged on another metric
        {"gate.metric": "test_accuracy", "gate.value": "nan"},
        {"gate.metric": "test_accuracy", "gate.value": "inf"},
        {"gate.metric": "test_accuracy", "gate.value": "not a number"},
        {"gate.metric": "test_accuracy"},
    ],
)
def test_a_champion_without_a_comparable_value_is_replaced(tags):
    decision = decide("test_accuracy", 0.5, "9", 0.01, Champion("8", tags))
    assert decision == Decision(PROMOTED, None, "8")


def test_a_retry_of_the_version_already_champion_repeats_its_decision():
    # Version 4 won against version 3 (0.80), then the promote step ran again.
    won = Decision(PROMOTED, 0.80, "3")
    tags = {
        **version_tags("test_accuracy", 0.85, won),
        "gate.metric": "test_accuracy",
    }
    again = decide("test_accuracy", 0.01, "4", 0.85, Champion("4", tags))
    assert again == Decision(PROMOTED, 0.80, "3", repeated=True)
    assert again.takes_champion

    first = version_tags("test_accuracy", 0.5, Decision(FIRST_MODEL, None, None))
    assert decide("test_accuracy", 0.0, "1", 0.5, Champion("1", first)) == Decision(
        FIRST_MODEL, None, None, repeated=True
    )
    # A champion alias set by hand, without gate tags: it counts as promoted.
    assert decide("test_accuracy", 0.0, "1", 0.5, Champion("1", {})).decision == PROMOTED


def test_version_tags_record_the_decision():
    tags = version_tags("test_accuracy", 0.78, Decision(KEPT_CHAMPION, 0.8, "1"))
    assert tags == {
        "gate.metric": "test_accuracy",
        "gate.value": "0.78",
        "gate.champion_value": "0.8",
        "gate.previous_champion": "1",
        "gate.decision": "kept-champion",
    }
    first = version_tags("test_loss", 0.5, Decision(FIRST_MODEL, None, None))
    assert first["gate.champion_value"] == "none" and first["gate.previous_champion"] == "none"


def test_the_gate_needs_no_mlflow():
    code = (
        "import sys, training.gate.policy; print(sorted(m for m in sys.modules if 'mlflow' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
