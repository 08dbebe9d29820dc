"""Regression without a cluster: the task chosen from the label, bad labels
refused, the metrics and which way they improve, the gate on test_rmse, the label's
normalisation and its inverse, the bundled diabetes set (the model: test_regression_model.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from training.config import SplitConfig, validate_config
from training.data.rows import denormalise_labels, normalise_labels, transform_batch
from training.data.schema import Plan
from training.data.summary import Stats, batch_summary
from training.data.task import FLOAT_CLASSES_MAX, MAX_CLASSES, choose_task, label_kind
from training.data.validate import feature_spec, validate
from training.errors import ConfigError, DataValidationError
from training.gate.policy import KEPT_CHAMPION, PROMOTED, Champion, decide
from training.manifest import FeatureSpec
from training.metrics import direction, for_task, regression_metrics

FEATURES = ["x1", "x2"]


def _frame(labels, n: int | None = None, seed: int = 0) -> pd.DataFrame:
    n = len(labels) if n is None else n
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    return pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": labels})


def _summarise(frame: pd.DataFrame, task: str = "auto", batch_rows: int = 64):
    """The driver's view of ``frame`` (summarised in batches, as the workers do): the data
    config, stats, and what validate decides."""
    data = validate_config({"data": {"label_column": "y", "task": task}}).data
    plan = Plan("parquet", "y", FEATURES, None)
    stats = Stats()
    for start in range(0, len(frame), batch_rows):
        stats.add(batch_summary(frame.iloc[start : start + batch_rows], plan, SplitConfig()))
    return data, plan, stats


# -- the task -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "kind"),
    [
        (pd.Series([1.5, 2.0]), "float"),
        (pd.Series([1, 2]), "int"),
        (pd.Series([True, False]), "bool"),
        (pd.Series(["a", "b"]), "other"),
        (pd.Series([1.5, None], dtype="double[pyarrow]"), "float"),  # Ray Data's arrow columns
        (pd.Series([3, 4], dtype="int64[pyarrow]"), "int"),
    ],
)
def test_label_kind(labels, kind):
    assert label_kind(labels) == kind


@pytest.mark.parametrize(
    ("kinds", "distinct", "fractional", "task"),
    [
        ({"float"}, 300, True, "regression"),  # a measurement
        ({"float"}, 214, False, "regression"),  # whole-valued floats, many of them (diabetes)
        ({"float"}, 3, True, "regression"),  # fractions are never class labels
        ({"float"}, 10, False, "classification"),  # digits' labels read as floats
        ({"float"}, FLOAT_CLASSES_MAX + 1, False, "regression"),
        ({"int"}, 10, False, "classification"),
        ({"int"}, 100, False, "classification"),  # CIFAR-100's labels
        ({"int"}, MAX_CLASSES + 1, False, "regression"),
        ({"other"}, 3, False, "classification"),
        ({"bool"}, 2, False, "classification"),
        ({"int", "float"}, 500, True, "regression"),  # an int column that met a float batch
    ],
)
def test_auto_chooses_the_task_from_the_label(kinds, distinct, fractional, task):
    chosen, why = choose_task("auto", "y", kinds, distinct, fractional)
    assert chosen == task
    assert why.startswith("auto:") and "'y'" in why


def test_an_explicit_task_wins_and_says_so():
    chosen = choose_task("regression", "y", {"int"}, 3, False)
    assert chosen == ("regression", "data.task=regression")
    assert choose_task("classification", "y", {"float"}, 500, True)[0] == "classification"


def test_float_labels_become_a_regression_with_train_label_statistics():
    rng = np.random.default_rng(1)
    frame = _frame(rng.normal(150.0, 40.0, size=400))
    data, plan, stats = _summarise(frame)
    task, why, classes = validate(stats, data, plan, ["f.parquet"])
    assert (task, classes) == ("regression", [])
    assert "float label 'y'" in why
    assert sum(stats.split_rows.values()) == 400
    assert stats.class_counts == {"train": {}, "val": {}, "test": {}} or stats.distinct_labels
    spec = feature_spec(stats, data, plan, classes, task)
    assert spec.task == "regression" and spec.num_outputs == 1
    # fitted on the training split only: not the whole column's mean
    from training.data.rows import assign_splits, hash_rows

    splits = assign_splits(hash_rows(frame[FEATURES].to_numpy(), frame["y"], 0), SplitConfig())
    train = frame["y"][splits == "train"]
    assert spec.label_mean == pytest.approx(train.mean())
    assert spec.label_std == pytest.approx(train.std(ddof=0))
    assert spec.label_mean != pytest.approx(frame["y"].mean(), abs=1e-9)


def test_continuous_labels_stop_being_counted_as_classes():
    frame = _frame(np.linspace(0.0, 1.0, 3000))
    data, plan, stats = _summarise(frame, batch_rows=1024)
    assert stats.many_values and stats.distinct_labels == MAX_CLASSES + 1
    assert all(not counts for counts in stats.class_counts.values())
    # a classifier asked for anyway: one message that names the fix
    data, plan, stats = _summarise(frame, task="classification", batch_rows=1024)
    with pytest.raises(DataValidationError, match="data.task=regression"):
        validate(stats, data, plan, ["f.parquet"])


@pytest.mark.parametrize(
    ("labels", "task", "message"),
    [
        ([np.nan if i % 40 == 0 else i * 0.37 for i in range(200)], "auto", "no value in label"),
        ([np.inf if i % 40 == 0 else i * 0.37 for i in range(200)], "auto", "infinite value"),
        ([7.5] * 200, "regression", "same value in every training row"),
        (["a", "b"] * 100, "regression", "not numbers"),
        ([True, False] * 100, "regression", "not numbers"),
    ],
)
def test_bad_regression_labels_are_refused_by_name(labels, task, message, tmp_path):
    frame = _frame(labels)
    data, plan, stats = _summarise(frame, task=task)
    table = tmp_path / "f.parquet"  # missing labels are located in the file, row by row
    frame.to_parquet(table)
    with pytest.raises(DataValidationError, match=message) as caught:
        validate(stats, data, plan, [str(table)])
    assert "'y'" in str(caught.value)


# -- config and metrics -------------------------------------------------------------------------


def test_a_regression_ranks_checkpoints_and_gates_on_rmse():
    for config in (
        validate_config({"data": {"task": "regression"}}),
        validate_config({}).with_overrides({"data.task": "regression"}),
    ):
        assert (config.sweep.metric, config.sweep.mode) == ("val_rmse", "min")
        checkpoint = config.train.checkpoint
        assert (checkpoint.score_attribute, checkpoint.score_order) == ("val_rmse", "min")
        assert config.mlflow.gate.metric == "test_rmse"
    # a metric both tasks have is kept; a classifier keeps its defaults
    kept = validate_config({"sweep": {"metric": "val_loss", "mode": "min"}}).with_overrides(
        {"data.task": "regression"}
    )
    assert kept.sweep.metric == "val_loss" and kept.mlflow.gate.metric == "test_rmse"
    classifier = validate_config({}).with_overrides({"data.task": "classification"})
    assert (classifier.sweep.metric, classifier.mlflow.gate.metric) == (
        "val_accuracy",
        "test_accuracy",
    )


def test_a_classifier_refuses_regression_metrics():
    raw = {"data": {"task": "classification"}, "mlflow": {"gate": {"metric": "test_r2"}}}
    with pytest.raises(ConfigError, match="mlflow.gate.metric=test_r2 is not a metric of"):
        validate_config(raw)
    auto = validate_config({"sweep": {"metric": "val_rmse", "mode": "min"}})
    with pytest.raises(ConfigError, match="sweep.metric=val_rmse"):
        auto.with_overrides({"data.task": "classification"})


def test_metric_directions_and_task_names():
    assert [direction(m) for m in ("val_rmse", "test_rmse", "val_mae", "test_r2")] == [
        "min",
        "min",
        "min",
        "max",
    ]
    assert for_task("val_accuracy", "regression") == "val_rmse"
    assert for_task("test_macro_f1", "regression") == "test_rmse"
    assert for_task("test_loss", "regression") == "test_loss"
    assert for_task("val_rmse", "classification") is None


def test_regression_metrics_match_scikit_learn():
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    rng = np.random.default_rng(2)
    y = rng.normal(50, 10, 500)
    p = y + rng.normal(0, 4, 500)
    e = p - y
    sums = [len(y), (e**2).sum(), np.abs(e).sum(), y.sum(), (y**2).sum()]
    m = regression_metrics(sums, prefix="test_")
    assert m["test_rmse"] == pytest.approx(mean_squared_error(y, p) ** 0.5)
    assert m["test_mae"] == pytest.approx(mean_absolute_error(y, p))
    assert m["test_r2"] == pytest.approx(r2_score(y, p))


def test_evaluate_regression_result_and_its_plot_sample():
    from training.inference.evaluate import PLOT_POINTS, regression_result

    y = np.arange(5000, dtype=np.float64)
    p = y + 2.0
    result, scored = regression_result(y, p, label_std=4.0)
    assert result.task == "regression" and result.per_class == [] and result.confusion == []
    assert result.metrics["test_rmse"] == pytest.approx(2.0)
    assert result.metrics["test_mae"] == pytest.approx(2.0)
    assert result.metrics["test_loss"] == pytest.approx(4.0 / 16.0)  # MSE in the learnt unit
    assert result.metrics["test_rows"] == 5000
    assert len(result.actual) == len(result.predicted) == PLOT_POINTS
    assert "RMSE 2" in result.headline
    assert scored.probs.shape == (5000, 0)


# -- the gate: lower wins -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("challenger", "expected"),
    [(40.0, PROMOTED), (49.5, KEPT_CHAMPION), (50.0, KEPT_CHAMPION), (60.0, KEPT_CHAMPION)],
)
def test_gate_on_test_rmse_promotes_the_lower_error(challenger, expected):
    champion = Champion("3", {"gate.metric": "test_rmse", "gate.value": repr(50.0)})
    decision = decide("test_rmse", 1.0, "4", challenger, champion)
    assert decision.decision == expected and decision.champion_value == 50.0


def test_gate_does_not_compare_rmse_with_a_classifier_champion():
    champion = Champion("3", {"gate.metric": "test_accuracy", "gate.value": "0.9"})
    decision = decide("test_rmse", 0.0, "4", 1000.0, champion)
    assert decision.decision == PROMOTED and decision.champion_value is None


# -- label normalisation ------------------------------------------------------------------------


def _spec(**extra) -> FeatureSpec:
    base = {
        "label_column": "y",
        "classes": [],
        "input_shape": [2],
        "mean": [0.0, 0.0],
        "std": [1.0, 1.0],
        "feature_columns": FEATURES,
        "task": "regression",
        "label_mean": 150.0,
        "label_std": 40.0,
    }
    return FeatureSpec.from_dict({**base, **extra})


def test_label_normalisation_round_trip():
    spec = _spec()
    labels = np.array([25.0, 150.0, 346.0, 151.25])
    frame = _frame(labels)
    out = transform_batch(frame, spec, with_labels=True)
    assert out["label"].dtype == np.float32
    np.testing.assert_allclose(out["label"], (labels - 150.0) / 40.0, rtol=1e-6)
    np.testing.assert_allclose(denormalise_labels(out["label"], spec), labels, rtol=1e-6)
    np.testing.assert_allclose(denormalise_labels(normalise_labels(labels, spec), spec), labels)
    # a spec without a task (an older checkpoint's) is a classifier
    new_keys = ("task", "label_mean", "label_std")
    legacy = {k: v for k, v in spec.to_dict().items() if k not in new_keys}
    old = FeatureSpec.from_dict({**legacy, "classes": [0, 1]})
    assert (old.task, old.label_mean, old.label_std, old.num_outputs) == ("classification", 0, 1, 2)


# -- the bundled demo ---------------------------------------------------------------------------


def test_builtin_diabetes_is_written_once_from_scikit_learn(tmp_path):
    import pyarrow.parquet as pq

    from training.data.builtin import DIABETES_FEATURES, ensure_diabetes
    from training.data.inputs import resolve_inputs

    path = ensure_diabetes(tmp_path)
    table = pq.read_table(path)
    assert table.num_rows == 442
    assert table.column_names == [*DIABETES_FEATURES, "label"]
    labels = table.column("label").to_numpy()
    assert labels.dtype == np.float64 and 25 <= labels.min() < labels.max() <= 346
    assert ensure_diabetes(tmp_path) == path  # once
    source = validate_config({"data": {"source": "builtin:diabetes"}}).data
    assert resolve_inputs(source)[0].endswith("datasets/diabetes/diabetes.parquet")
    unknown = validate_config({"data": {"source": "builtin:iris"}}).data
    with pytest.raises(DataValidationError, match="builtin:diabetes"):
        resolve_inputs(unknown)
