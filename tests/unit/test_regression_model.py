"""A regression model without a cluster: the loop's MSE and its metrics
all-reduced across workers, and the registered pyfunc's one number out (in process and in the
Ray Data batch predictor's actor class)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_regression import _spec  # the one regression FeatureSpec of these tests

from training.config import validate_config

FEATURES = ["x1", "x2"]


def _frame(labels) -> pd.DataFrame:
    x = np.random.default_rng(0).normal(size=(len(labels), 2))
    return pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": labels})


# -- the loop: MSE, and metrics all-reduced across workers -----------------------------------------


class _Ctx:
    """A loop context over in-memory splits; ``others`` are the other ranks' summed tensors."""

    world_size = 1
    rank = 0
    strategy = "ddp"

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
    from training.tracking import flavour

    spec = _spec().to_dict()
    config = {"kind": "mlp", "hidden_sizes": [8], "dropout": 0.0, "channels": [4], "cnn_hidden": 8}
    torch.manual_seed(0)
    net = build_network(config, [2], 1).eval()
    state = {"model": net.state_dict(), "spec": spec, "model_config": config}
    frame = _frame(np.linspace(25, 346, 40))
    path = flavour.save_model(state, str(tmp_path_factory.mktemp("reg") / "model"), frame.head(5))
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
    from training.tracking import flavour

    model, _, frame, path = regression_model
    files = flavour.pack(path)
    scored = PyfuncPredictor(files)(frame.drop(columns=["y"]))
    assert list(scored.columns) == [*FEATURES, "prediction"] and CONFIDENCE not in scored
    expected = model.predict(frame.drop(columns=["y"]))["prediction"]
    np.testing.assert_allclose(scored["prediction"], expected)
    evaluated = PyfuncPredictor(files, label_column="y")(frame)
    assert list(evaluated.columns) == ["prediction", TRUE_LABEL]


# -- the report ---------------------------------------------------------------------------------


def test_report_plots_a_regression_without_a_confusion_matrix(tmp_path):
    from training.report.html import report_plots
    from training.report.plots import learning_curves_figure, predicted_vs_actual_figure

    actual = list(np.linspace(25, 346, 50))
    predicted = [a * 0.8 + 30 for a in actual]
    history = [
        {"epoch": e, "train_loss": 1 / e, "val_loss": 1.2 / e, "val_rmse": 60 - e} for e in (1, 2)
    ]
    plots = report_plots(
        str(tmp_path),
        train_history=history,
        per_class=[],
        confusion=[],
        class_names=[],
        actual=actual,
        predicted=predicted,
    )
    assert list(plots) == [
        "final training: train/val curves",
        "evaluation: predicted vs actual (test split)",
        "evaluation: residuals (test split)",
    ]
    assert all((tmp_path / p).stat().st_size > 1000 for p in plots.values())
    figure = predicted_vs_actual_figure(actual, predicted)
    assert len(figure.axes[0].collections) == 1  # one scatter, beside the diagonal
    curves = learning_curves_figure(history)
    assert [ax.get_ylabel() for ax in curves.axes] == ["loss", "rmse"]  # RMSE on its own axis
