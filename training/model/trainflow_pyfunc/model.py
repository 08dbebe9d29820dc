"""The registered model: raw table in, predicted label and one probability per class out (a
classifier), or the predicted number in one ``prediction`` column (a regression).

An MLflow pyfunc (``mlflow.pyfunc.PythonModel``) logged as code: ``load_context`` reads the
state file (weights, feature spec, label map, train-split statistics) with
``torch.load(weights_only=True)`` — tensors and plain data only, no pickled objects — and
``predict`` applies the transform training applied (:mod:`.transform`, fitted at training time):
the feature columns in their training order (or the image column's arrays), minus the train
mean, over the train std; a regression's output is mapped back to the label's unit (times the
train label std, plus its mean). A text model (``model.kind: hf``) reads its text column as a
string, tokenized by the tokenizer the state holds (``tokens.py``), and runs the merged
Hugging Face model (``hf.py``): transformers and tokenizers are then its requirements too.

MLflow's signature check runs first (columns present, dtypes convertible, extra columns
dropped); the transform's checks catch what a signature cannot: no rows, NaN or infinite values,
an image array of the wrong size. Each becomes an ``MlflowException`` naming the column, which
``mlflow models serve`` returns as HTTP 400.
"""

from __future__ import annotations

import os
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException

from .causal_lm import CAUSAL_LM
from .generation import GENERATED, PROMPT, generate_texts
from .networks import build_network
from .tokens import padded, tokens_state
from .transform import FEATURES, TransformError, check_columns, is_regression, label_values
from .transform import input_columns as input_columns  # the flavour's signature reads it here
from .transform import transform as raw_to_tensors

#: The output column holding the predicted label; every other output column is a class.
PREDICTION = "prediction"
#: The name of the state file among the model's artifacts.
STATE_ARTIFACT = "state"
#: Rows per forward pass of a text model's network.
TEXT_BATCH = 64


def bad_input(message: str) -> MlflowException:
    """A user error: HTTP 400 from the scoring server, with this message in its body."""
    return MlflowException.invalid_parameter_value(message)


def prediction_device(model_config: dict[str, Any] | None) -> str:
    """Where the network runs, by MLflow's own rule for PyTorch models: ``model_config``'s
    ``device`` (``mlflow.pyfunc.load_model(uri, model_config={"device": "cpu"})``), else
    ``MLFLOW_DEFAULT_PREDICTION_DEVICE``, else the GPU when there is one."""
    chosen = (model_config or {}).get("device") or os.environ.get(
        "MLFLOW_DEFAULT_PREDICTION_DEVICE"
    )
    return chosen or ("cuda" if torch.cuda.is_available() else "cpu")


def num_outputs(spec: dict[str, Any]) -> int:
    """The network's outputs: one per class, or one number."""
    return 1 if is_regression(spec) else len(spec["classes"])


def labels_array(classes: list[Any]) -> np.ndarray:
    """The classes as an array of their own type: ints stay ints, strings stay strings."""
    if all(isinstance(c, str) for c in classes):
        return np.asarray(classes, dtype=object)
    if all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in classes):
        return np.asarray(classes, dtype=np.int64)
    if all(isinstance(c, (int, float, np.number)) for c in classes):
        return np.asarray(classes, dtype=np.float64)
    return np.asarray(classes, dtype=object)


class TrainflowModel(mlflow.pyfunc.PythonModel):
    """A trainflow model as an MLflow pyfunc: a classifier, or a regression (``spec.task``)."""

    def load_context(self, context) -> None:
        path = context.artifacts[STATE_ARTIFACT]
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.load_state(state, prediction_device(context.model_config))

    def load_state(self, state: dict[str, Any], device: str = "cpu") -> None:
        """Build the network from a state dict on ``device`` (also used without MLflow's
        loader)."""
        spec = state["spec"]
        network = build_network(
            state["model_config"],
            spec["input_shape"],
            num_outputs(spec),
            spec.get("task", "classification"),
            spec.get("cardinalities"),
            tokens_state(spec),
        )
        network.load_state_dict(state["model"])
        self.device = torch.device(device)
        self.network = network.to(self.device).eval()
        self.spec = spec
        self.classes = labels_array(list(spec["classes"]))
        self.regression = is_regression(spec)

    def features(self, frame: pd.DataFrame) -> np.ndarray:
        """The network's input (float32 [rows, width]) for a raw table: training's transform
        (a text's token ids: one array per row, padded per batch by :meth:`_outputs`)."""
        try:
            check_columns(frame, self.spec)
            if len(frame) == 0:
                raise TransformError("the input table has no rows; send at least one row")
            return raw_to_tensors(frame, self.spec, with_labels=False)[FEATURES]
        except TransformError as exc:
            raise bad_input(str(exc)) from None

    def _batches(self, features: np.ndarray):
        """The network's input in batches: all rows at once, or a text's token ids in batches
        of TEXT_BATCH rows, each padded to its own longest row (a transformer's memory grows
        with rows x length)."""
        if not tokens_state(self.spec):
            yield features
            return
        for first in range(0, len(features), TEXT_BATCH):
            yield padded(features[first : first + TEXT_BATCH])

    def _outputs(self, frame: pd.DataFrame) -> np.ndarray:
        """The network's raw outputs (float32 [rows, outputs]) for a raw table."""
        parts = []
        with torch.no_grad():
            for batch in self._batches(self.features(frame)):
                outputs = self.network(torch.from_numpy(batch).to(self.device))
                parts.append(outputs.float().cpu().numpy())
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def values(self, frame: pd.DataFrame) -> np.ndarray:
        """A regression's predictions (float64 [rows]) in the label's own unit."""
        return label_values(self._outputs(frame)[:, 0], self.spec)

    def probabilities(self, frame: pd.DataFrame) -> np.ndarray:
        """Class probabilities (float64 [rows, classes]) of a raw table."""
        logits = torch.from_numpy(self._outputs(frame))
        return torch.softmax(logits, dim=1).numpy().astype(np.float64)

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if self.spec.get("task") == CAUSAL_LM:
            return self.generate(frame, params)
        if self.regression:
            return pd.DataFrame({PREDICTION: self.values(frame)})
        probs = self.probabilities(frame)
        out = {PREDICTION: self.classes[probs.argmax(axis=1)]}
        for i, name in enumerate(class_columns(list(self.spec["classes"]))):
            out[name] = probs[:, i]
        return pd.DataFrame(out)

    def generate(self, frame: pd.DataFrame, params=None) -> pd.DataFrame:
        """A language model's continuations of the ``prompt`` column (``generation.py``)."""
        if PROMPT not in frame.columns or not len(frame):
            raise bad_input(f"a language model needs a {PROMPT!r} column of text, with rows")
        prompts = frame[PROMPT].tolist()
        if not all(isinstance(p, str) for p in prompts):
            raise bad_input(f"column {PROMPT!r} holds values that are not text")
        try:
            texts = generate_texts(self.network, self.spec["tokens"], prompts, params, self.device)
        except ValueError as exc:
            raise bad_input(str(exc)) from None
        return pd.DataFrame({GENERATED: texts})


def class_columns(classes: list[Any]) -> list[str]:
    """One output column per class, named after it."""
    return [str(c) for c in classes]


#: The class's name before it served regressions too. A model registered then imports it by that
#: name, and in a process that loaded a newer model first it gets this module (Python keeps the
#: first ``trainflow_pyfunc`` it imported).
TrainflowClassifier = TrainflowModel
