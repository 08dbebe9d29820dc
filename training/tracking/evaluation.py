"""MLflow's own evaluation (classifier or regressor) of the pyfunc's predictions, beside
trainflow's report.

``mlflow.models.evaluate`` runs on the static predictions the pyfunc made for the split (one
scoring pass, shared with trainflow's metrics): its standard metrics (accuracy, precision,
recall, F1, ...), per-class metrics table and confusion matrix. MLflow computes ROC and PR
curves only from a model with ``predict_proba`` (its sklearn-like flavours), so the pyfunc's
probability columns are drawn with MLflow's own curve code as custom artifacts (from a seeded
sample of at most ``CURVE_ROWS`` rows, tagged on the run when sampled). A regression
(no classes) gets MLflow's regressor metrics (mean_squared_error, root_mean_squared_error,
mean_absolute_error, r2_score, ...).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import numpy as np

from training.tracking.runs import Tracker
from training.tracking.store import global_uris

log = logging.getLogger(__name__)

# MLflow's evaluator metrics that repeat trainflow's own under another name (its accuracy is
# test_accuracy, its regression errors test_rmse / test_mae / test_r2): one copy of each, ours,
# which the gate, the registry's tags and the report read.
DUPLICATE_METRICS = frozenset(
    {"accuracy_score", "root_mean_squared_error", "mean_absolute_error", "r2_score"}
)

TARGET = "target"
PREDICTED = "prediction"
# The ROC and PR curves are drawn from at most this many rows (a seeded sample): MLflow's curve
# code keeps every threshold and plots every point, and on a 1.5M-row test split that took 21 s
# and 1.7 GiB in the driver; 100,000 rows draw the same curves in ~4 s and ~280 MiB.
CURVE_ROWS = 100_000


def curve_sample(rows: int, limit: int | None = None, seed: int = 0) -> np.ndarray | slice:
    """Which of ``rows`` rows the curves are drawn from: all of them up to ``limit`` (default
    ``CURVE_ROWS``), else a seeded sample of ``limit`` rows, in their order."""
    limit = CURVE_ROWS if limit is None else limit
    if rows <= limit:
        return slice(None)
    return np.sort(np.random.default_rng(seed).choice(rows, size=limit, replace=False))


def _curves(labels: np.ndarray, probs: np.ndarray, classes: list[Any]):
    """A custom-artifact function: MLflow's ROC and precision-recall curves of ``probs``."""

    def roc_and_pr_curves(eval_df, builtin_metrics, artifacts_dir):
        from matplotlib import pyplot
        from mlflow.models.evaluation.evaluators.classifier import _gen_classifier_curve

        out = {}
        binary = len(classes) == 2
        for kind, name in (("roc", "roc_curve_plot"), ("pr", "precision_recall_curve_plot")):
            curve = _gen_classifier_curve(
                is_binomial=binary,
                y=labels,
                y_probs=probs[:, 1] if binary else probs,
                labels=np.asarray(classes),
                pos_label=classes[1] if binary else None,
                curve_type=kind,
                sample_weights=None,
            )
            pyplot.clf()
            curve.plot_fn(**curve.plot_fn_args)
            path = os.path.join(artifacts_dir, f"{name}.png")
            pyplot.savefig(path, bbox_inches="tight")
            pyplot.close(pyplot.gcf())
            out[name] = path
        return out

    return roc_and_pr_curves


@contextlib.contextmanager
def one_copy_each():
    """MLflow's evaluator without what trainflow's evaluate run already has: the metrics in
    :data:`DUPLICATE_METRICS` and a root-level confusion_matrix.png beside
    plots/confusion_matrix.png, and without the autologging set-up that static predictions do
    not use. MLflow has no switch for any of them; its steps are wrapped for the duration
    (tests/unit/test_evaluation_curves.py pins that they exist)."""
    from mlflow.models.evaluation import base
    from mlflow.models.evaluation.default_evaluator import BuiltInEvaluator
    from mlflow.models.evaluation.evaluators.classifier import ClassifierEvaluator

    log_metrics = BuiltInEvaluator.log_metrics
    log_confusion_matrix = ClassifierEvaluator._log_confusion_matrix
    configure_autologging = base.configure_autologging_for_evaluation

    def log_our_missing_metrics(self) -> None:
        # log_metrics rebuilds aggregate_metrics from metrics_values
        for key in DUPLICATE_METRICS:
            self.metrics_values.pop(key, None)
        log_metrics(self)

    BuiltInEvaluator.log_metrics = log_our_missing_metrics
    ClassifierEvaluator._log_confusion_matrix = lambda self: None
    # Static predictions need no autologging; MLflow still turns it off flavour by flavour,
    # importing each installed one (mlflow.pytorch imports Lightning and torch._dynamo when the
    # [lightning] extra is there: ~4 s of CPU per evaluation).
    base.configure_autologging_for_evaluation = _no_autologging_setup
    try:
        yield
    finally:
        BuiltInEvaluator.log_metrics = log_metrics
        ClassifierEvaluator._log_confusion_matrix = log_confusion_matrix
        base.configure_autologging_for_evaluation = configure_autologging


def _no_autologging_setup(enable_tracing: bool = True):
    return contextlib.nullcontext()


def evaluate_predictions(
    tracker: Tracker,
    run_id: str,
    labels: np.ndarray,
    predictions: np.ndarray,
    probs: np.ndarray,
    classes: list[Any],
) -> dict[str, float]:
    """``mlflow.models.evaluate`` of a split's predictions, logged to ``run_id``: a classifier's,
    or a regressor's when there are no ``classes``."""
    import mlflow
    import pandas as pd

    frame = pd.DataFrame({TARGET: labels, PREDICTED: predictions})
    sample = curve_sample(len(labels))
    if classes:
        kind = {
            "model_type": "classifier",
            "evaluator_config": {"label_list": list(classes), "log_explainer": False},
            "custom_artifacts": [_curves(labels[sample], probs[sample], list(classes))],
        }
    else:
        kind = {"model_type": "regressor", "evaluator_config": {"log_explainer": False}}
    was_running = tracker.client.get_run(run_id).info.status == "RUNNING"
    try:
        with global_uris(tracker.tracking_uri), one_copy_each(), mlflow.start_run(run_id=run_id):
            result = mlflow.models.evaluate(
                data=frame, targets=TARGET, predictions=PREDICTED, evaluators="default", **kind
            )
    finally:
        if was_running:  # leaving the `with` ended the run; ending it is the caller's job
            tracker.client.update_run(run_id, status="RUNNING")
    if classes and len(labels) > CURVE_ROWS:
        tracker.set_tags(run_id, {"trainflow.curve_rows": CURVE_ROWS})
    return {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
