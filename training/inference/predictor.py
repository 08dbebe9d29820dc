"""The Ray Data batch predictor: the registered pyfunc model, loaded once per actor.

Every scoring path (``trainflow predict``, ``trainflow evaluate``, the pipeline's evaluate stage)
goes through :class:`PyfuncPredictor`: the MLflow model's files travel to the actor (any node),
which loads them with ``mlflow.pyfunc.load_model`` — the same code, schema check included, that
an MLflow client or ``mlflow models serve`` runs.
"""

from __future__ import annotations

import shutil
import tempfile

import pandas as pd
import torch

from training.tracking import pyfunc

#: The column of an evaluation batch holding the true label (the user's label column's values).
TRUE_LABEL = "__trainflow_true_label__"
CONFIDENCE = "confidence"


def single_actor():
    """The compute strategy of every prediction: one actor."""
    import ray.data

    # One model replica: the data is small next to the cost of another actor on 2 cores.
    return ray.data.ActorPoolStrategy(size=1)


def joined(inputs: pd.DataFrame, scored: pd.DataFrame) -> pd.DataFrame:
    """The input columns, then the model's (a name taken by an input gets ``_model``)."""
    out = inputs.reset_index(drop=True)
    for name in scored.columns:
        out[name if name not in out.columns else f"{name}_model"] = scored[name].to_numpy()
    return out


class PyfuncPredictor:
    """A Ray Data actor: loads the packed MLflow model once, then scores pandas batches.

    With ``label_column`` (evaluation) a batch comes back as the model's output plus the true
    label; otherwise (prediction) as the input columns plus the model's output and confidence.
    """

    def __init__(self, files: dict[str, bytes], label_column: str | None = None):
        torch.set_num_threads(1)
        self._dir = tempfile.mkdtemp(prefix="trainflow-model-")
        self.model = pyfunc.load_packed(files, self._dir)
        self.classes = [c.name for c in self.model.metadata.get_output_schema().inputs][1:]
        self.label_column = label_column

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        if len(batch) == 0:  # an empty block; a table with no rows at all is refused elsewhere
            scored = pd.DataFrame({c: [] for c in [pyfunc.PREDICTION, *self.classes]})
        else:
            scored = pyfunc.predict(self.model, batch)
        if self.label_column is not None:
            scored[TRUE_LABEL] = batch[self.label_column].to_numpy()
            return scored
        scored[CONFIDENCE] = scored[self.classes].max(axis=1)
        return joined(batch, scored)

    def __del__(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)
