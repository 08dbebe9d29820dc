"""The metrics of a held-out split, scored by the pyfunc model on the split's raw rows.

The split's raw rows come from :mod:`training.data.splits`, so the model sees the table exactly
as a user would send it (column names, dtypes) and the score is the one any MLflow client would
get.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from training.data.splits import batch_rows, raw_split, raw_split_here
from training.errors import DataValidationError
from training.inference.predictor import (
    TRUE_LABEL,
    PyfuncPredictor,
    device_of,
    our_errors,
    scoring_actor,
)
from training.manifest import FeatureSpec, Manifest
from training.metrics import regression_metrics
from training.tracking import flavour

#: Rows of a regression's (actual, predicted) pairs kept for the report's plots.
PLOT_POINTS = 2000
#: Rows per scored batch, at most (MLflow's pyfunc scored 223k rows/s in 4,096-row batches, 43k
#: in 512), and a batch's float64 feature matrix stays near this size (images get fewer rows; a
#: scored batch also holds the model's activations).
SCORE_BATCH_ROWS = 4096
SCORE_BATCH_BYTES = 16 * 1024**2


@dataclass
class EvalResult:
    """One split's metrics, overall and per class, and its confusion matrix (a classifier); or
    a regression's metrics and a sample of its (actual, predicted) pairs for the plots."""

    metrics: dict[str, float]  # test_accuracy, test_macro_f1 | test_rmse, test_mae, test_r2;
    # test_loss, test_rows
    per_class: list[dict[str, Any]]  # class, precision, recall, f1, support
    confusion: list[list[int]]  # rows = true class, columns = predicted class
    class_names: list[str]
    task: str = "classification"
    actual: list[float] = field(default_factory=list)  # a regression's, at most PLOT_POINTS
    predicted: list[float] = field(default_factory=list)

    @property
    def headline(self) -> str:
        """The one line the console shows: the task's main test metrics."""
        m = self.metrics
        if self.task == "causal_lm":
            return f"test perplexity {m['test_perplexity']:.4g} (loss {m['test_loss']:.4f})"
        if self.task == "regression":
            return f"test RMSE {m['test_rmse']:.4g}, MAE {m['test_mae']:.4g}, R² {m['test_r2']:.4f}"
        return f"test accuracy {m['test_accuracy']:.4f}, macro-F1 {m['test_macro_f1']:.4f}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Scored:
    """A split's true labels, predicted labels and class probabilities (for MLflow's evaluator)."""

    labels: np.ndarray
    predictions: np.ndarray
    probs: np.ndarray
    classes: list[Any] = field(default_factory=list)


#: A split this small is scored here, by the same pyfunc predictor, instead of in a Ray Data
#: actor: the actor's start-up (a process importing torch and MLflow, loading the model) cost
#: ~5 s on 2 cores for a few hundred rows. Larger splits stream through Ray Data.
SCORE_HERE_BELOW_ROWS = 20_000


def _scored_batches(
    files: dict[str, bytes], manifest: Manifest, split: str, endpoint_url, use_gpu: bool
):
    """The split's rows scored by the pyfunc (a large split on a GPU with ``use_gpu``): pandas
    batches of model output + true label."""
    label_column = manifest.spec.label_column
    if manifest.rows.get(split, SCORE_HERE_BELOW_ROWS) < SCORE_HERE_BELOW_ROWS:
        predictor = PyfuncPredictor(files, label_column=label_column, threads=None)
        for batch in raw_split_here(manifest, split, endpoint_url):
            yield predictor(batch)
        return
    scored = raw_split(manifest, split, endpoint_url).map_batches(
        PyfuncPredictor,
        fn_constructor_kwargs={
            "files": files,
            "label_column": label_column,
            "device": device_of(use_gpu),
        },
        batch_size=batch_rows(manifest.spec, SCORE_BATCH_ROWS, SCORE_BATCH_BYTES),
        batch_format="pyarrow",
        **scoring_actor(use_gpu),
    )
    yield from scored.iter_batches(batch_size=4096, batch_format="pandas")


def evaluate_model(
    files: dict[str, bytes],
    classes: list[Any],
    manifest: Manifest,
    split: str = "test",
    endpoint_url: str | None = None,
    use_gpu: bool = False,
) -> tuple[EvalResult, Scored]:
    """Score a split's raw rows with a packed MLflow model (in this process when small, on a
    GPU with ``use_gpu`` when not). A model without classes is a regression, and evaluates on
    regression data."""
    if (not classes) != manifest.spec.is_regression:
        kinds = ("a classifier", "a regression")
        raise DataValidationError(
            f"the model is {kinds[not classes]} but the data's task is {manifest.spec.task} "
            f"({manifest.task_reason or 'data.task'}); set data.task to the model's task"
        )
    if list(classes) != list(manifest.spec.classes):
        raise DataValidationError(
            f"the model knows classes {classes} but the data has {manifest.spec.classes}; "
            "evaluate on data with the same label column and classes"
        )
    names = flavour.class_columns(list(classes))
    index = pd.Index(list(classes))
    labels, predictions, probs = [], [], []
    with our_errors():
        for batch in _scored_batches(files, manifest, split, endpoint_url, use_gpu):
            labels.append(batch[TRUE_LABEL].to_numpy())
            predictions.append(batch[flavour.PREDICTION].to_numpy())
            probs.append(batch[names].to_numpy(dtype=np.float64))
    if not labels:
        raise DataValidationError(f"the {split} split is empty; use more data or a larger split")
    if manifest.spec.is_regression:
        return regression_result(
            np.concatenate(labels), np.concatenate(predictions), manifest.spec.label_std
        )
    out = Scored(np.concatenate(labels), np.concatenate(predictions), np.vstack(probs), classes)
    true_codes, pred_codes = index.get_indexer(out.labels), index.get_indexer(out.predictions)
    if (true_codes < 0).any():
        unknown = sorted({str(v) for v in out.labels[true_codes < 0]})
        raise DataValidationError(
            f"label column {manifest.spec.label_column!r} holds values the model does not know "
            f"({unknown[:5]}); known classes: {list(classes)[:20]}"
        )
    n = len(classes)
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (true_codes, pred_codes), 1)
    p_true = out.probs[np.arange(len(true_codes)), true_codes]
    loss_sum = float(-np.log(np.clip(p_true, 1e-12, None)).sum())
    return metrics_from_confusion(confusion, loss_sum, names), out


def evaluate_state(
    state: dict[str, Any],
    manifest: Manifest,
    split: str = "test",
    endpoint_url: str | None = None,
    raw_example: pd.DataFrame | None = None,
    use_gpu: bool = False,
) -> tuple[EvalResult, Scored]:
    """Evaluate a checkpoint's state through the pyfunc model it becomes when registered."""
    with tempfile.TemporaryDirectory() as tmp:
        files = flavour.pack(flavour.save_model(state, f"{tmp}/model", raw_example))
    classes = FeatureSpec.from_dict(state["spec"]).classes
    return evaluate_model(files, classes, manifest, split, endpoint_url, use_gpu)


def regression_result(
    labels: np.ndarray, predictions: np.ndarray, label_std: float = 1.0
) -> tuple[EvalResult, Scored]:
    """RMSE, MAE and R² in the label's unit; test_loss is the MSE in the unit the model learnt
    (labels over the train split's std), comparable with the training's val_loss."""
    y = np.asarray(labels, dtype=np.float64)
    predicted = np.asarray(predictions, dtype=np.float64)
    if len(y) == 0:
        raise DataValidationError("the evaluation split is empty; use more data or a larger split")
    error = predicted - y
    sse = float(np.square(error).sum())
    centred = y - y.mean()  # sum y = 0, sum y² = the total sum of squares
    sums = [len(y), sse, float(np.abs(error).sum()), 0.0, float(np.square(centred).sum())]
    metrics = regression_metrics(sums, prefix="test_")
    metrics["test_loss"] = sse / len(y) / label_std**2
    metrics["test_rows"] = float(len(y))
    # Evenly spaced rows (the split's order is the input's): a fixed sample for the plots.
    keep = np.unique(np.linspace(0, len(y) - 1, min(len(y), PLOT_POINTS)).astype(np.int64))
    result = EvalResult(
        metrics,
        [],
        [],
        [],
        task="regression",
        actual=y[keep].tolist(),
        predicted=predicted[keep].tolist(),
    )
    return result, Scored(y, predicted, np.zeros((len(y), 0)), [])


def metrics_from_confusion(
    confusion: np.ndarray, loss_sum: float, class_names: list[str]
) -> EvalResult:
    """Accuracy, macro-F1 and mean loss, and per-class precision, recall and F1."""
    rows = int(confusion.sum())
    if rows == 0:
        raise DataValidationError("the evaluation split is empty; use more data or a larger split")
    true_pos = np.diag(confusion).astype(np.float64)
    predicted = confusion.sum(axis=0).astype(np.float64)
    support = confusion.sum(axis=1).astype(np.float64)
    precision = np.divide(true_pos, predicted, out=np.zeros_like(true_pos), where=predicted > 0)
    recall = np.divide(true_pos, support, out=np.zeros_like(true_pos), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(denom), where=denom > 0)
    per_class = [
        {
            "class": name,
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(class_names)
    ]
    present = support > 0
    metrics = {
        "test_accuracy": float(true_pos.sum() / rows),
        "test_macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "test_loss": loss_sum / rows,
        "test_rows": float(rows),
    }
    return EvalResult(metrics, per_class, confusion.tolist(), class_names)
