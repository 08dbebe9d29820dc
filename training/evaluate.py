"""Batch inference with Ray Data over a checkpoint, and the metrics of the held-out split."""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from training.config import ModelConfig
from training.errors import DataValidationError, ModelNotFoundError
from training.loop import STATE_FILE, load_state
from training.manifest import FEATURES, LABEL, FeatureSpec, Manifest
from training.model import NormalizedClassifier, build_model

log = logging.getLogger(__name__)

PREDICTION = "prediction"
CONFIDENCE = "confidence"


@dataclass
class EvalResult:
    metrics: dict[str, float]  # test_accuracy, test_macro_f1, test_loss, test_rows
    per_class: list[dict[str, Any]]  # class, precision, recall, f1, support
    confusion: list[list[int]]  # rows = true class, columns = predicted class
    class_names: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_model_state(path: str) -> dict[str, Any]:
    """A trainflow checkpoint (a directory holding state.pt, or the file itself)."""
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isfile(os.path.join(directory, STATE_FILE)):
        raise ModelNotFoundError(f"no {STATE_FILE} at {path}; pass a trainflow checkpoint")
    return load_state(directory)


def model_from_state(state: dict[str, Any]) -> tuple[torch.nn.Module, FeatureSpec]:
    spec = FeatureSpec.from_dict(state["spec"])
    model = build_model(ModelConfig(**state["model_config"]), spec.input_shape, spec.num_classes)
    model.load_state_dict(state["model"])
    model.eval()
    return model, spec


def serving_model(state: dict[str, Any]) -> NormalizedClassifier:
    """Raw features in, logits out: what MLflow serves."""
    model, spec = model_from_state(state)
    return NormalizedClassifier(model, spec.mean, spec.std).eval()


def feature_matrix(column) -> np.ndarray:
    """A features column as float32 [n, d]: parquet list columns arrive as arrays of arrays."""
    column = np.asarray(column)
    if column.dtype == object:
        column = np.stack(column)
    return column.astype(np.float32, copy=False)


def _single_actor():
    import ray.data

    # One model replica: the split is small next to the cost of another actor on 2 cores.
    return ray.data.ActorPoolStrategy(size=1)


class _BatchPredictor:
    """A Ray Data actor: builds the model once, then scores batches.

    Processed batches (numpy: features, label) get predictions and per-row loss; raw batches
    (pandas, the training table's columns) are transformed with the model's own feature spec and
    returned whole with the predicted label and its confidence appended.
    """

    def __init__(
        self, state: dict[str, Any], raw_input: bool = False, data_spec: dict | None = None
    ):
        torch.set_num_threads(1)
        self.model, self.spec = model_from_state(state)
        self.raw_input = raw_input
        self.rescale = (
            _rescaling(FeatureSpec.from_dict(data_spec), self.spec) if data_spec else None
        )

    @torch.no_grad()
    def _score(self, features: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(torch.as_tensor(np.asarray(features, dtype=np.float32)))
        return logits, torch.softmax(logits, dim=1)

    def __call__(self, batch):
        if self.raw_input:
            from training.data.rows import transform_batch

            features = transform_batch(batch, self.spec, with_labels=False)[FEATURES]
            _, probs = self._score(features)
            classes = np.asarray(self.spec.classes, dtype=object)
            out = batch.copy()
            out[PREDICTION] = classes[probs.argmax(dim=1).numpy()]
            out[CONFIDENCE] = probs.max(dim=1).values.numpy()
            return out
        features = feature_matrix(batch[FEATURES])
        if self.rescale is not None:
            scale, shift = self.rescale
            features = features * scale + shift
        logits, probs = self._score(features)
        labels = torch.tensor(batch[LABEL], dtype=torch.int64)
        loss = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        return {PREDICTION: probs.argmax(dim=1).numpy(), LABEL: batch[LABEL], "loss": loss.numpy()}


def _rescaling(data_spec: FeatureSpec, model_spec: FeatureSpec):
    """Map features normalised with the data's statistics onto the model's, if they differ."""
    data_mean, data_std = np.asarray(data_spec.mean), np.asarray(data_spec.std)
    model_mean, model_std = np.asarray(model_spec.mean), np.asarray(model_spec.std)
    if np.allclose(data_mean, model_mean) and np.allclose(data_std, model_std):
        return None
    model_std = np.where(model_std > 0, model_std, 1.0)
    data_std = np.where(data_std > 0, data_std, 1.0)
    scale = (data_std / model_std).astype(np.float32)
    shift = ((data_mean - model_mean) / model_std).astype(np.float32)
    return scale, shift


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
        _BatchPredictor,
        fn_constructor_kwargs={"state": state, "data_spec": manifest.spec.to_dict()},
        batch_size=512,
        batch_format="numpy",
        compute=_single_actor(),
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


def predict_files(
    state: dict[str, Any], files: list[str], output: str, fmt: str = "parquet"
) -> int:
    """Score raw rows (same columns as training); write inputs + prediction, whole or nothing."""
    import pyarrow.parquet as pq

    from training.data.read import read_raw

    scored = read_raw(files, fmt).map_batches(
        _BatchPredictor,
        fn_constructor_kwargs={"state": state, "raw_input": True},
        batch_size=1024,
        batch_format="pandas",
        compute=_single_actor(),
    )
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = f"{output}.tmp-{uuid.uuid4().hex[:8]}"
    writer = None
    rows = 0
    try:
        for table in scored.iter_batches(batch_size=4096, batch_format="pyarrow"):
            writer = writer or pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            rows += table.num_rows
        if writer is None:
            raise DataValidationError(f"{files} hold no rows; nothing to predict")
        writer.close()
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return rows
