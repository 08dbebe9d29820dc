"""The Ray Data batch predictor: one model per actor, batches in, predictions out."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from training.manifest import FEATURES, LABEL, FeatureSpec
from training.model.serving import model_from_state

PREDICTION = "prediction"
CONFIDENCE = "confidence"


def feature_matrix(column) -> np.ndarray:
    """A features column as float32 [n, d]: parquet list columns arrive as arrays of arrays."""
    column = np.asarray(column)
    if column.dtype == object:
        column = np.stack(column)
    return column.astype(np.float32, copy=False)


def single_actor():
    """The compute strategy of every prediction: one actor."""
    import ray.data

    # One model replica: the split is small next to the cost of another actor on 2 cores.
    return ray.data.ActorPoolStrategy(size=1)


class BatchPredictor:
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
