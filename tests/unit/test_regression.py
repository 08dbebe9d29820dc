"""Regression without a cluster (issue 15, part 3): the task chosen from the label, the metrics
and which way they improve, the gate on test_rmse, the label's normalisation and its inverse,
the loop's metrics all-reduced across workers, and the pyfunc's one number out."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from training.config import SplitConfig, validate_config
from training.data.rows import denormalise_labels, normalise_labels, transform_batch
from training.data.schema import Plan
from training.data.summary import Stats, batch_summary
from training.data.task import FLOAT_CLASSES_MAX, MAX_CLASSES, choose_task, label_kind
from training.data.validate import feature_spec, validate
from training.errors import ConfigError, DataValidationError
from training.manifest import FeatureSpec
from training.metrics import direction, for_task, regression_metrics
from training.tracking.gate import KEPT_CHAMPION, PROMOTED, Champion, decide

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
def test_bad_regression_labels_are_refused_by_name(labels, task, message):
    data, plan, stats = _summarise(_frame(labels), task=task)
    with pytest.raises(DataValidationError, match=message) as caught:
        validate(stats, data, plan, ["f.parquet"])
    assert "'y'" in str(caught.value)


# -- config and metrics -------------------------------------------------------------------------


def test_a_regression_ranks_checkpoints_and_gates_on_rmse():
    for config in (
        validate_config({"data": {"task": "regression"}}),
        validate_config({}).with_task("regression"),
    ):
        assert (config.sweep.metric, config.sweep.mode) == ("val_rmse", "min")
        checkpoint = config.train.checkpoint
        assert (checkpoint.score_attribute, checkpoint.score_order) == ("val_rmse", "min")
        assert config.mlflow.gate.metric == "test_rmse"
    # a metric both tasks have is kept; a classifier keeps its defaults
    kept = validate_config({"sweep": {"metric": "val_loss", "mode": "min"}}).with_task("regression")
    assert kept.sweep.metric == "val_loss" and kept.mlflow.gate.metric == "test_rmse"
    classifier = validate_config({}).with_task("classification")
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
        auto.with_task("classification")


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


# -- the loop: MSE, and metrics all-reduced across workers -----------------------------------------


class _Ctx:
    """A loop context over in-memory splits; ``others`` are the other ranks' summed tensors."""

    world_size = 1
    rank = 0

    def __init__(self, train, val, others=None):
        self.train, self.val, self.others = train, val, others
        self.reports, self.reduced = [], []

    def train_batches(self, epoch, batch_size, start=0):
        x, y = self.train
        for first in range(start * batch_size, len(y), batch_size):
            yield x[first : first + batch_size], y[first : first + batch_size]

    def val_batches(self, batch_size):
        x, y = self.val
        for first in range(0, len(y), batch_size):
            yield x[first : first + batch_size], y[first : first + batch_size]

    def prepare_model(self, model):
        return model

    def all_reduce_sum(self, values):
        self.reduced.append(values.clone())
        return values + self.others.pop(0) if self.others else values

    def latest_state(self):
        return None

    def report(self, metrics, state):
        self.reports.append(metrics)


def _linear_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = (1.5 * x[:, 0] - 0.5 * x[:, 1] + 0.1 * torch.randn(n, generator=g)).float()
    return x, y


def _settings(epochs=6):
    from training.loop.loop import loop_config

    config = validate_config(
        {
            "data": {"task": "regression", "label_column": "y"},
            "model": {"hidden_sizes": [16], "dropout": 0.0},
            "train": {"batch_size": 16, "lr": 0.02, "lr_schedule": "constant"},
        }
    )
    return loop_config(config, _spec(label_mean=10.0, label_std=4.0), epochs)


def test_the_loop_learns_a_regression_with_mse_and_reports_rmse_mae_r2():
    from training.loop.loop import run_loop

    ctx = _Ctx(_linear_data(200, 0), _linear_data(80, 1))
    history = run_loop(_settings(), ctx)
    last = history[-1]
    assert {"val_loss", "val_rmse", "val_mae", "val_r2"} <= set(last) and "val_accuracy" not in last
    assert last["train_loss"] < history[0]["train_loss"]
    assert last["val_r2"] > 0.8
    # RMSE in the label's unit: the normalised MSE (val_loss) times the label's std
    assert last["val_rmse"] == pytest.approx(4.0 * last["val_loss"] ** 0.5, rel=1e-6)


def test_validation_metrics_are_global_across_workers():
    """Rank 0 of two, given the other rank's sums by the all-reduce, reports what one worker
    over the whole validation split reports."""
    from training.loop.loop import _build_run, _validate

    val = _linear_data(90, 3)
    whole = _Ctx(_linear_data(10, 0), val)
    run = _build_run(_settings(), whole)
    expected = _validate(run)
    halves = [(val[0][:50], val[1][:50]), (val[0][50:], val[1][50:])]
    other = _Ctx(None, halves[1])
    run.ctx = other
    _validate(run)  # rank 1's local sums
    rank0 = _Ctx(None, halves[0], others=[other.reduced[-1]])
    run.ctx = rank0
    got = _validate(run)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key  # float32 losses per batch
    one_shard = _Ctx(None, halves[0])
    run.ctx = one_shard
    assert _validate(run)["val_rmse"] != pytest.approx(expected["val_rmse"], rel=1e-9)


# -- the registered pyfunc: the predicted number ---------------------------------------------------


@pytest.fixture(scope="module")
def regression_model(tmp_path_factory):
    import mlflow.pyfunc

    from training.model.trainflow_pyfunc.networks import build_network
    from training.tracking import pyfunc

    spec = _spec().to_dict()
    config = {"kind": "mlp", "hidden_sizes": [8], "dropout": 0.0, "channels": [4], "cnn_hidden": 8}
    torch.manual_seed(0)
    net = build_network(config, [2], 1).eval()
    state = {"model": net.state_dict(), "spec": spec, "model_config": config}
    frame = _frame(np.linspace(25, 346, 40))
    path = pyfunc.save(state, str(tmp_path_factory.mktemp("reg") / "model"), frame.head(5))
    return mlflow.pyfunc.load_model(path), net, frame, path


def test_pyfunc_returns_the_predicted_number_in_the_label_unit(regression_model):
    model, net, frame, _ = regression_model
    out = model.predict(frame.drop(columns=["y"]))
    assert list(out.columns) == ["prediction"]
    assert out["prediction"].dtype == np.float64
    with torch.no_grad():
        raw = net(torch.tensor(frame[FEATURES].to_numpy(), dtype=torch.float32))[:, 0].numpy()
    np.testing.assert_allclose(out["prediction"], raw * 40.0 + 150.0, rtol=1e-5)
    # the same bad-input checks as a classifier's
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match="x2"):
        model.predict(frame.drop(columns=["y"]).assign(x2=np.nan))


def test_pyfunc_signature_outputs_one_double(regression_model):
    from mlflow.models import Model

    _, _, _, path = regression_model
    outputs = Model.load(path).signature.outputs.to_dict()
    assert outputs == [{"type": "double", "name": "prediction", "required": True}]


def test_batch_predictor_appends_the_number_and_no_confidence(regression_model):
    from training.inference.predictor import CONFIDENCE, TRUE_LABEL, PyfuncPredictor
    from training.tracking import pyfunc

    model, _, frame, path = regression_model
    files = pyfunc.pack(path)
    scored = PyfuncPredictor(files)(frame.drop(columns=["y"]))
    assert list(scored.columns) == [*FEATURES, "prediction"] and CONFIDENCE not in scored
    expected = model.predict(frame.drop(columns=["y"]))["prediction"]
    np.testing.assert_allclose(scored["prediction"], expected)
    evaluated = PyfuncPredictor(files, label_column="y")(frame)
    assert list(evaluated.columns) == ["prediction", TRUE_LABEL]


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
