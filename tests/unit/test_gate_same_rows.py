"""The gate on both models' predictions of the same rows: paired bootstrap, rule, slices,
incompatible champions, the record. Pure: no MLflow store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.gate.policy import (
    KEPT_CHAMPION,
    PROMOTED,
    RECORD_TAG,
    Rules,
    incompatible,
    same_rows,
    version_tags,
)
from training.gate.stats import metric_of, paired_bootstrap, resampled_metric, slice_drops


def _two_classifiers(rows: int, champion_right: int, challenger_extra: int, seed: int = 0):
    """Labels over 10 classes; the champion right on ``champion_right`` rows, the challenger on
    the same rows plus ``challenger_extra`` more (a small, real win)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, rows)
    wrong = (labels + 1) % 10
    order = rng.permutation(rows)
    champion = wrong.copy()
    champion[order[:champion_right]] = labels[order[:champion_right]]
    challenger = champion.copy()
    extra = order[champion_right : champion_right + challenger_extra]
    challenger[extra] = labels[extra]
    return labels, challenger, champion


@pytest.mark.parametrize("rows", [300, 500])
def test_a_small_win_is_noise_under_interval_but_wins_under_point(rows):
    # +0.4 points on 500 rows (+2 rows); +0.33 points on 300 (+1 row): both noise.
    extra = round(0.004 * rows)
    labels, challenger, champion = _two_classifiers(rows, int(0.9 * rows), extra)
    assert metric_of("test_accuracy", labels, challenger) - metric_of(
        "test_accuracy", labels, champion
    ) == pytest.approx(extra / rows)
    interval = same_rows(Rules("test_accuracy"), "2", "1", labels, challenger, champion)
    point = same_rows(Rules("test_accuracy", rule="point"), "2", "1", labels, challenger, champion)
    assert interval.decision == KEPT_CHAMPION
    assert "lower bound" in interval.record.reason
    assert interval.record.interval[0] <= 0 < interval.record.interval[1]
    assert point.decision == PROMOTED
    assert point.record.rows == rows


def test_a_clear_win_passes_the_interval_rule():
    labels, challenger, champion = _two_classifiers(2000, 1600, 200)
    decision = same_rows(Rules("test_accuracy"), "2", "1", labels, challenger, champion)
    assert decision.decision == PROMOTED
    low, high = decision.record.interval
    assert 0 < low < 0.1 < high
    assert decision.champion_value == pytest.approx(0.8)


def test_the_bootstrap_is_seeded():
    y, better, worse = _regression()
    first = paired_bootstrap("test_rmse", y, better, worse, seed=7)
    assert first == paired_bootstrap("test_rmse", y, better, worse, seed=7)
    assert first != paired_bootstrap("test_rmse", y, better, worse, seed=8)


def test_macro_f1_per_resample_matches_the_evaluation():
    from training.inference.evaluate import metrics_from_confusion

    labels, _, champion = _two_classifiers(300, 200, 0, seed=3)
    confusion = np.zeros((10, 10), dtype=np.int64)
    np.add.at(confusion, (labels, champion), 1)
    expected = metrics_from_confusion(confusion, 0.0, [str(i) for i in range(10)])
    assert metric_of("test_macro_f1", labels, champion) == pytest.approx(
        expected.metrics["test_macro_f1"]
    )
    index = np.random.default_rng(0).integers(0, 300, size=(5, 300))
    vectorised = resampled_metric("test_macro_f1", labels, champion, index)
    one_by_one = [metric_of("test_macro_f1", labels[i], champion[i]) for i in index]
    assert vectorised == pytest.approx(one_by_one)


def _regression(rows: int = 400, noise_old: float = 1.0, noise_new: float = 0.5):
    rng = np.random.default_rng(1)
    y = rng.normal(10, 3, rows)
    return y, y + rng.normal(0, noise_new, rows), y + rng.normal(0, noise_old, rows)


@pytest.mark.parametrize("metric", ["test_rmse", "test_mae", "test_r2"])
def test_regression_metrics_lower_error_wins(metric):
    y, better, worse = _regression()
    assert same_rows(Rules(metric), "2", "1", y, better, worse).decision == PROMOTED
    kept = same_rows(Rules(metric), "3", "2", y, worse, better)
    assert kept.decision == KEPT_CHAMPION
    assert kept.record.difference < 0  # worse, whichever way the metric runs


def test_rmse_and_r2_values():
    y, better, _ = _regression()
    assert metric_of("test_rmse", y, better) == pytest.approx(np.sqrt(np.mean((better - y) ** 2)))
    sst = np.sum((y - y.mean()) ** 2)
    assert metric_of("test_r2", y, better) == pytest.approx(1 - np.sum((better - y) ** 2) / sst)


def test_a_class_whose_recall_drops_blocks_and_is_named():
    labels, challenger, champion = _two_classifiers(3000, 2400, 400)
    hit = np.flatnonzero((labels == 3) & (champion == 3))
    challenger[hit[: len(hit) // 2]] = 4  # class 3 loses half its recall
    decision = same_rows(Rules("test_accuracy"), "2", "1", labels, challenger, champion)
    assert decision.decision == KEPT_CHAMPION
    assert [s["slice"] for s in decision.record.slices] == ["class=3"]
    assert "class=3" in decision.record.reason
    off = Rules("test_accuracy", max_slice_drop=None)
    assert same_rows(off, "2", "1", labels, challenger, champion).decision == PROMOTED


def test_a_slice_column_value_that_drops_blocks():
    labels, challenger, champion = _two_classifiers(2000, 1600, 200)
    region = np.where(np.arange(2000) % 4 == 0, "north", "south")
    north = np.flatnonzero((region == "north") & (champion == labels))
    challenger[north[:100]] = (labels[north[:100]] + 2) % 10
    drops = slice_drops(
        "test_accuracy", labels, challenger, champion, {"region": region}, 0.1, min_rows=20
    )
    assert "region=north" in [d["slice"] for d in drops]
    assert "region=south" not in [d["slice"] for d in drops]


def test_small_slices_are_not_judged():
    labels, challenger, champion = _two_classifiers(200, 180, 0)
    challenger[labels == 5] = 6
    assert slice_drops("test_accuracy", labels, challenger, champion, None, 0.1, min_rows=500) == []


@pytest.mark.parametrize(("policy", "verdict"), [("promote", PROMOTED), ("keep", KEPT_CHAMPION)])
def test_an_incompatible_champion_follows_on_incompatible(policy, verdict):
    decision = incompatible(
        Rules("test_accuracy", on_incompatible=policy), "5", "4", "column 'x' is gone"
    )
    assert decision.decision == verdict
    assert "column 'x' is gone" in decision.record.reason
    assert decision.previous == "4"


def test_the_record_is_on_the_tags_and_headline():
    labels, challenger, champion = _two_classifiers(2000, 1600, 200)
    decision = same_rows(Rules("test_accuracy"), "2", "1", labels, challenger, champion)
    tags = version_tags("test_accuracy", 0.9, decision)
    stored = json.loads(tags[RECORD_TAG])
    assert stored["verdict"] == PROMOTED and stored["rows"] == 2000
    assert stored["champion_version"] == "1"
    headline = decision.record.headline
    assert headline.startswith("accuracy 0.9 vs champion 0.8 on the same 2000 rows, +10")
    assert "at 95%" in headline
    table = decision.record.table()
    assert table["verdict"] == [PROMOTED] and len(table["metric"]) == 1
