"""MLflow's ROC and PR curves are drawn from a bounded sample of a large test split."""

from __future__ import annotations

import numpy as np

from training.tracking import evaluation


def test_curve_sample_keeps_small_splits_whole_and_samples_large_ones_the_same_way():
    assert evaluation.curve_sample(10, limit=10) == slice(None)
    first = evaluation.curve_sample(1000, limit=100)
    assert len(first) == 100 and len(set(first.tolist())) == 100
    assert (np.diff(first) > 0).all()  # rows in their order
    assert first.max() < 1000
    assert (evaluation.curve_sample(1000, limit=100) == first).all()  # seeded


def test_the_curves_get_at_most_curve_rows_and_the_run_says_so(monkeypatch):
    import mlflow

    monkeypatch.setattr(evaluation, "CURVE_ROWS", 50)
    seen, tags = {}, {}

    def curves(labels, probs, classes):
        seen.update(labels=len(labels), probs=probs.shape)
        return lambda *args: {}

    class Result:
        metrics = {"accuracy_score": 0.5}

    def fake_evaluate(data, **kwargs):
        seen["frame_rows"] = len(data)
        return Result()

    class Info:
        status = "FINISHED"

    class Client:
        def get_run(self, run_id):
            return type("Run", (), {"info": Info()})()

    class Tracker:
        client = Client()
        tracking_uri = "sqlite:///unused.db"

        def set_tags(self, run_id, values):
            tags.update(values)

    monkeypatch.setattr(evaluation, "_curves", curves)
    monkeypatch.setattr(mlflow.models, "evaluate", fake_evaluate)
    monkeypatch.setattr(mlflow, "start_run", lambda run_id: _nothing())
    monkeypatch.setattr(evaluation, "global_uris", lambda uri: _nothing())
    monkeypatch.setattr(evaluation, "one_copy_each", _nothing)
    rows = 200
    labels = np.arange(rows) % 3
    probs = np.full((rows, 3), 1 / 3, dtype=np.float32)
    metrics = evaluation.evaluate_predictions(Tracker(), "r1", labels, labels, probs, [0, 1, 2])
    assert metrics == {"accuracy_score": 0.5}
    assert seen == {"labels": 50, "probs": (50, 3), "frame_rows": rows}  # metrics on every row
    assert tags == {"trainflow.curve_rows": 50}


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_mlflow_evaluation_logs_no_second_copy_of_our_metrics_or_confusion_matrix(tmp_path):
    """MLflow's evaluator on a real (sqlite) store logs neither accuracy_score
    (our test_accuracy) nor a root-level confusion_matrix.png (our plots/confusion_matrix.png);
    its other metrics and artifacts stay."""
    from mlflow import MlflowClient

    from training.config import MlflowConfig, PipelineConfig
    from training.tracking.store import configure

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = configure(PipelineConfig(mlflow=MlflowConfig(tracking_uri=uri, experiment="dup")))
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    rng = np.random.default_rng(0)
    labels = np.arange(60) % 3
    predictions = np.where(rng.random(60) < 0.8, labels, (labels + 1) % 3)
    probs = np.full((60, 3), 0.1, dtype=np.float32)
    probs[np.arange(60), predictions] = 0.8
    metrics = evaluation.evaluate_predictions(tracker, run, labels, predictions, probs, [0, 1, 2])
    logged = MlflowClient(uri).get_run(run).data.metrics
    assert "accuracy_score" not in logged and "accuracy_score" not in metrics
    assert {"f1_score", "example_count"} <= set(logged)
    files = {a.path for a in MlflowClient(uri).list_artifacts(run)}
    assert "confusion_matrix.png" not in files
    assert "roc_curve_plot.png" in files


def test_evaluating_predictions_skips_mlflows_autologging_set_up(tmp_path, monkeypatch):
    """Static predictions need no autologging: MLflow's evaluation would turn it off flavour by
    flavour, importing mlflow.pytorch (and with it Lightning) where torch is loaded."""
    from mlflow.models.evaluation import base

    from training.config import MlflowConfig, PipelineConfig
    from training.tracking.store import configure

    entered = []
    monkeypatch.setattr(
        base, "configure_autologging_for_evaluation", lambda **kw: entered.append(kw)
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = configure(PipelineConfig(mlflow=MlflowConfig(tracking_uri=uri, experiment="auto")))
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    labels = np.arange(40) % 2
    probs = np.full((40, 2), 0.3, dtype=np.float32)
    probs[np.arange(40), labels] = 0.7
    metrics = evaluation.evaluate_predictions(tracker, run, labels, labels, probs, [0, 1])
    assert entered == [] and metrics["f1_score"] == 1.0
