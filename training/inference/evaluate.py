"""The metrics of a held-out split: Ray Data batch inference over a checkpoint's model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from training.errors import DataValidationError
from training.inference.predictor import PREDICTION, BatchPredictor, single_actor
from training.manifest import LABEL, FeatureSpec, Manifest


@dataclass
class EvalResult:
    """One split's metrics, overall and per class, and its confusion matrix."""

    metrics: dict[str, float]  # test_accuracy, test_macro_f1, test_loss, test_rows
    per_class: list[dict[str, Any]]  # class, precision, recall, f1, support
    confusion: list[list[int]]  # rows = true class, columns = predicted class
    class_names: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_state(
    state: dict[str, Any], manifest: Manifest, split: str = "test", endpoint_url: str | None = None
) -> EvalResult:
    """Score one split with Ray Data batch inference; metrics from the confusion matrix."""
    from training.data.read import read_split

    spec = FeatureSpec.from_dict(state["spec"])
    if spec.classes != manifest.spec.classes:
        raise DataValidationError(
            f"the model knows classes {spec.classes} but the data has {manifest.spec.classes}; "
            "evaluate on data with the same label column and classes"
        )
    scored = read_split(manifest, split, endpoint_url).map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"state": state, "data_spec": manifest.spec.to_dict()},
        batch_size=512,
        batch_format="numpy",
        compute=single_actor(),
    )
    n = spec.num_classes
    confusion = np.zeros((n, n), dtype=np.int64)
    loss_sum = 0.0
    # Stream the scored rows: only the n x n matrix and a sum stay in memory.
    for batch in scored.iter_batches(batch_size=4096, batch_format="numpy"):
        np.add.at(confusion, (batch[LABEL].astype(np.int64), batch[PREDICTION]), 1)
        loss_sum += float(batch["loss"].sum())
    return metrics_from_confusion(confusion, loss_sum, [str(c) for c in spec.classes])


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
