"""The registered model: raw table in, predicted label and one probability per class out (a
classifier), or the predicted number in one ``prediction`` column (a regression).

An MLflow pyfunc (``mlflow.pyfunc.PythonModel``) logged as code: ``load_context`` reads the
state file (weights, feature spec, label map, train-split statistics) with
``torch.load(weights_only=True)`` — tensors and plain data only, no pickled objects — and
``predict`` applies the preprocessing frozen at training time: the feature columns in their
training order (or the image column's arrays), minus the train mean, over the train std; a
regression's output is mapped back to the label's unit (times the train label std, plus its mean).

MLflow's signature check runs first (columns present, dtypes convertible, extra columns
dropped); the checks here catch what a signature cannot: no rows, NaN or infinite values, an
image array of the wrong size. Each raises an ``MlflowException`` naming the column, which
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

from .networks import build_network

#: The output column holding the predicted label; every other output column is a class.
PREDICTION = "prediction"
#: The name of the state file among the model's artifacts.
STATE_ARTIFACT = "state"


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


def is_regression(spec: dict[str, Any]) -> bool:
    """A regression predicts one number (older states, without a task, are classifiers)."""
    return spec.get("task", "classification") == "regression"


def num_outputs(spec: dict[str, Any]) -> int:
    """The network's outputs: one per class, or one number."""
    return 1 if is_regression(spec) else len(spec["classes"])


def input_columns(spec: dict[str, Any]) -> list[str]:
    """The raw columns the model reads, in order."""
    return [spec["image_column"]] if spec.get("image_column") else list(spec["feature_columns"])


def labels_array(classes: list[Any]) -> np.ndarray:
    """The classes as an array of their own type: ints stay ints, strings stay strings."""
    if all(isinstance(c, str) for c in classes):
        return np.asarray(classes, dtype=object)
    if all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in classes):
        return np.asarray(classes, dtype=np.int64)
    if all(isinstance(c, (int, float, np.number)) for c in classes):
        return np.asarray(classes, dtype=np.float64)
    return np.asarray(classes, dtype=object)


def _image_matrix(values: pd.Series, column: str, width: int) -> np.ndarray:
    cells = values.to_numpy()
    if cells.dtype != object and cells.ndim >= 2:  # a tensor column
        return cells.reshape(len(cells), -1).astype(np.float64)
    rows = []
    for i, cell in enumerate(cells):
        if cell is None or (np.ndim(cell) == 0 and pd.isna(cell)):
            raise bad_input(f"column {column!r} is empty in row {i}; every row needs an array")
        rows.append(np.asarray(cell, dtype=np.float64).ravel())
    lengths = sorted({len(r) for r in rows})
    if lengths != [width]:
        raise bad_input(
            f"column {column!r} holds arrays of {lengths[:5]} values; the model expects {width}"
        )
    return np.stack(rows)


def raw_features(frame: pd.DataFrame, spec: dict[str, Any]) -> np.ndarray:
    """The feature matrix (float64 [rows, width]) of a raw table, before normalisation."""
    columns = input_columns(spec)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise bad_input(f"the input lacks column(s) {missing[:10]}; the model reads {columns[:10]}")
    if len(frame) == 0:
        raise bad_input("the input table has no rows; send at least one row")
    width = int(np.prod(spec["input_shape"]))
    if spec.get("image_column"):
        raw = _image_matrix(frame[columns[0]], columns[0], width)
        per_column = {columns[0]: ~np.isfinite(raw).all(axis=1)}
    else:
        try:
            raw = frame[columns].to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError):
            bad = [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]
            raise bad_input(f"column(s) {bad[:10]} are not numeric") from None
        finite = np.isfinite(raw)
        per_column = {c: ~finite[:, i] for i, c in enumerate(columns)}
    bad = {c: int(mask.sum()) for c, mask in per_column.items() if mask.any()}
    if bad:
        detail = ", ".join(f"{c!r}: {n} rows" for c, n in list(bad.items())[:10])
        raise bad_input(
            f"NaN or infinite values in column(s) {list(bad)[:10]} ({detail}); drop or fill "
            "those rows"
        )
    return raw


class TrainflowClassifier(mlflow.pyfunc.PythonModel):
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
        )
        network.load_state_dict(state["model"])
        self.device = torch.device(device)
        self.network = network.to(self.device).eval()
        self.spec = spec
        self.mean = np.asarray(spec["mean"], dtype=np.float64)
        std = np.asarray(spec["std"], dtype=np.float64)
        self.std = np.where(std > 0, std, 1.0)
        self.classes = labels_array(list(spec["classes"]))
        self.regression = is_regression(spec)
        self.label_mean = float(spec.get("label_mean", 0.0))
        self.label_std = float(spec.get("label_std", 1.0))

    def _outputs(self, frame: pd.DataFrame) -> np.ndarray:
        """The network's raw outputs (float32 [rows, outputs]) for a raw table."""
        features = ((raw_features(frame, self.spec) - self.mean) / self.std).astype(np.float32)
        with torch.no_grad():
            outputs = self.network(torch.from_numpy(features).to(self.device))
            return outputs.float().cpu().numpy()

    def values(self, frame: pd.DataFrame) -> np.ndarray:
        """A regression's predictions (float64 [rows]) in the label's own unit."""
        normalised = self._outputs(frame)[:, 0].astype(np.float64)
        return normalised * self.label_std + self.label_mean

    def probabilities(self, frame: pd.DataFrame) -> np.ndarray:
        """Class probabilities (float64 [rows, classes]) of a raw table."""
        logits = torch.from_numpy(self._outputs(frame))
        return torch.softmax(logits, dim=1).numpy().astype(np.float64)

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if self.regression:
            return pd.DataFrame({PREDICTION: self.values(frame)})
        probs = self.probabilities(frame)
        out = {PREDICTION: self.classes[probs.argmax(axis=1)]}
        for i, name in enumerate(class_columns(list(self.spec["classes"]))):
            out[name] = probs[:, i]
        return pd.DataFrame(out)


def class_columns(classes: list[Any]) -> list[str]:
    """One output column per class, named after it."""
    return [str(c) for c in classes]
