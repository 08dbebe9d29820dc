"""Drift between two training splits (training.data.drift) and the gate's drift rule
(training.gate.drift): known PSI values, references built from data, block and warn."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.data import drift
from training.gate import drift as gate_drift
from training.gate import policy as gate


def test_psi_of_known_shares():
    # (0.25 - 0.5) ln(0.25/0.5) + (0.75 - 0.5) ln(0.75/0.5)
    assert drift.psi([0.5, 0.5], [0.25, 0.75]) == pytest.approx(
        0.25 * math.log(2) + 0.25 * math.log(1.5)
    )
    assert drift.psi([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]) == 0.0
    # a bin empty on one side counts as epsilon, not as infinity
    assert drift.psi([1.0, 0.0], [0.9, 0.1]) == pytest.approx(
        -0.1 * math.log(0.9) + (0.1 - 1e-4) * math.log(0.1 / 1e-4)
    )


def _numeric(values, gaps=0):
    values = np.asarray(values, dtype=np.float64)
    return drift.numeric_reference(values, len(values), gaps)


def test_the_same_data_does_not_drift_and_a_shift_does():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, 5000)
    champion = {"numeric": {"x": _numeric(base)}}
    same = drift.compare(champion, {"numeric": {"x": _numeric(base)}})
    assert same[0].psi == 0.0 and same[0].tvd == 0.0
    resampled = drift.compare(champion, {"numeric": {"x": _numeric(rng.normal(0, 1, 5000))}})
    assert resampled[0].psi < 0.02  # sampling noise only
    shifted = drift.compare(champion, {"numeric": {"x": _numeric(rng.normal(1, 1, 5000))}})
    assert shifted[0].psi > 0.5  # a one-sigma shift is a large drift


def test_the_numeric_psi_matches_the_psi_of_decile_bins_counted_exactly():
    rng = np.random.default_rng(1)
    old, new = rng.normal(0, 1, 4000), rng.normal(0.3, 1.2, 4000)
    edges = np.quantile(old, np.linspace(0.1, 0.9, 9))
    count = lambda v: np.histogram(v, [-np.inf, *edges, np.inf])[0] / len(v)  # noqa: E731
    exact = drift.psi(count(old).tolist(), count(new).tolist())
    sketched = drift.numeric_drift("x", _numeric(old), _numeric(new)).psi
    assert sketched == pytest.approx(exact, rel=0.05)


def test_ties_are_one_bin_and_gaps_are_their_own():
    zeros = np.r_[np.zeros(500), np.arange(1, 501)]
    ref = _numeric(zeros)
    assert drift.edges(ref["quantiles"])[0] == 0.0
    assert drift.cdf(ref["quantiles"], 0.0) == pytest.approx(0.5, abs=0.01)
    assert drift.numeric_drift("x", ref, _numeric(zeros)).psi == 0.0
    with_gaps = _numeric(zeros, gaps=1000)
    assert with_gaps["missing"] == 0.5
    moved = drift.numeric_drift("x", ref, with_gaps)
    assert moved.tvd == pytest.approx(0.5) and moved.psi > 1


def test_categorical_shares_and_a_new_mix():
    old = drift.categorical_reference({"a": 60, "b": 30, "c": 10}, missing=0)
    assert old["shares"] == {"a": 0.6, "b": 0.3, "c": 0.1}
    new = drift.categorical_reference({"a": 30, "b": 30, "d": 40}, missing=0)
    found = drift.categorical_drift("k", old, new)
    # bins a, b, c, other, missing: 0.6/0.3/0.1/0/0 vs 0.3/0.3/0/0.4/0
    assert found.tvd == pytest.approx(0.4)
    expected = drift.psi([0.6, 0.3, 0.1, 0, 0], [0.3, 0.3, 0, 0.4, 0])
    assert found.psi == pytest.approx(expected)


def test_compare_sorts_by_psi_and_skips_columns_one_side_lacks():
    ref = {"numeric": {"x": _numeric(np.arange(100))}, "categorical": {}}
    new = {"numeric": {"x": _numeric(np.arange(100) + 50), "y": _numeric(np.arange(5))}}
    found = drift.compare(ref, new)
    assert [d.column for d in found] == ["x"]
    report = drift.DriftReport("3", found)
    assert report.table()["column"] == ["x"] and report.over(0.1) == found


def _promoted() -> gate.Decision:
    record = gate.GateRecord("test_accuracy", gate.PROMOTED, "won", "2", "1")
    return gate.Decision(gate.PROMOTED, 0.9, "1", record=record)


DRIFT = {"champion_version": "1", "columns": [{"column": "x1", "kind": "numeric", "psi": 1.7}]}


def test_drift_beyond_max_drift_blocks_and_names_the_column():
    decision = gate_drift.apply(_promoted(), DRIFT, 0.2, "block", "test_accuracy", "2")
    assert decision.decision == gate.KEPT_CHAMPION and not decision.takes_champion
    assert "'x1' PSI 1.7" in decision.record.reason
    assert "max_drift 0.2" in decision.record.reason
    assert decision.record.verdict == gate.KEPT_CHAMPION
    assert decision.record.drift == DRIFT["columns"]
    tags = gate.version_tags("test_accuracy", 0.95, decision)
    assert tags[gate.DECISION_TAG] == gate.KEPT_CHAMPION and "x1" in tags[gate.RECORD_TAG]


def test_warn_promotes_and_says_so():
    decision = gate_drift.apply(_promoted(), DRIFT, 0.2, "warn", "test_accuracy", "2")
    assert decision.decision == gate.PROMOTED
    assert "'x1' PSI 1.7" in decision.record.reason and "promoted anyway" in decision.record.reason


@pytest.mark.parametrize(("drift_report", "limit"), [(DRIFT, None), (DRIFT, 2.0), (None, 0.2)])
def test_no_limit_no_drift_or_small_drift_changes_nothing(drift_report, limit):
    before = _promoted()
    assert gate_drift.apply(before, drift_report, limit, "block", "test_accuracy", "2") is before
