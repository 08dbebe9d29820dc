"""The champion as an MLflow pyfunc: built from a trainflow state, saved, moved and loaded.

The model is logged as code: a three-line entry script that sets
``trainflow_pyfunc.model.TrainflowModel`` as the model, the package itself as
``code_paths`` (torch, numpy, pandas, mlflow only), and our state file as its one artifact.
Nothing is pickled, so the model loads where trainflow is not installed.

Every consumer goes through ``mlflow.pyfunc.load_model`` on the model's files: trainflow's
``predict`` and ``evaluate`` (in a Ray Data actor, from :func:`pack`), in-process clients and
``mlflow models serve``.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import DataValidationError, one_line
from training.model import trainflow_pyfunc
from training.model.trainflow_pyfunc.model import (
    PREDICTION,
    STATE_ARTIFACT,
    class_columns,
    input_columns,
    labels_array,
)

if TYPE_CHECKING:
    import pandas as pd

#: The package shipped with the model; inside the model it is the top-level ``trainflow_pyfunc``.
CODE_DIR = Path(trainflow_pyfunc.__file__).parent
#: The state file's name inside the model (``artifacts/state.pt``).
STATE_FILE_IN_MODEL = "artifacts/state.pt"
EXAMPLE_ROWS = 5
_ENTRY = '''"""trainflow's model, logged as code (see trainflow_pyfunc.model)."""
import mlflow

try:  # the copy shipped with the model (its code_paths)
    from trainflow_pyfunc.model import TrainflowModel
except ModuleNotFoundError:  # only while trainflow saves the model
    from training.model.trainflow_pyfunc.model import TrainflowModel

mlflow.models.set_model(TrainflowModel())
'''


def requirements() -> list[str]:
    """What loading the model needs, pinned to this environment's versions."""
    pins = []
    for package in ("mlflow", "torch", "pandas", "numpy"):
        try:
            version = importlib.metadata.version(package).split("+")[0]  # drop "+cpu"
        except importlib.metadata.PackageNotFoundError:
            continue
        pins.append(f"{package}=={version}")
    return pins


def _column_type(series) -> Any:
    """The signature type of a raw column: floats as double (float32 upcasts), ints as long."""
    import numpy as np
    import pandas as pd
    from mlflow.types import DataType
    from mlflow.types.schema import Array

    if pd.api.types.is_bool_dtype(series):
        return DataType.boolean
    if pd.api.types.is_integer_dtype(series):
        return DataType.long
    if pd.api.types.is_float_dtype(series):
        return DataType.double
    if series.dtype == object and len(series) and isinstance(series.iloc[0], (list, np.ndarray)):
        return Array(DataType.double)
    return DataType.string


def signature(spec: dict[str, Any], example: pd.DataFrame | None):
    """Named columns in (the raw columns the model reads), prediction and classes out (a
    regression: the predicted number only)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    columns = input_columns(spec)
    if example is not None:
        inputs = [ColSpec(_column_type(example[c]), c) for c in columns]
    elif spec.get("image_column"):
        inputs = [ColSpec(Array(DataType.double), columns[0])]
    else:
        inputs = [ColSpec(DataType.double, c) for c in columns]
    kind = "f" if spec.get("task") == "regression" else labels_array(spec["classes"]).dtype.kind
    label_type = {"i": DataType.long, "f": DataType.double}.get(kind, DataType.string)
    outputs = [ColSpec(label_type, PREDICTION)]
    outputs += [ColSpec(DataType.double, c) for c in class_columns(list(spec["classes"]))]
    return ModelSignature(Schema(inputs), Schema(outputs))


def input_example(spec: dict[str, Any], raw_rows: pd.DataFrame) -> pd.DataFrame:
    """A few raw rows of the columns the model reads, arrays as lists (JSON-able)."""
    example = raw_rows[input_columns(spec)].head(EXAMPLE_ROWS).reset_index(drop=True)
    if spec.get("image_column"):
        column = spec["image_column"]
        example[column] = [list(map(float, _flat(v))) for v in example[column]]
    return example


def _flat(value):
    import numpy as np

    return np.asarray(value, dtype=np.float64).ravel()


def model_kwargs(state_path: str, spec: dict[str, Any], raw_rows: pd.DataFrame | None, tmp: str):
    """The keyword arguments of ``mlflow.pyfunc.save_model``/``log_model`` for a state file.

    A custom model (``model.kind: custom``) carries its factory's package too, so the model
    rebuilds the user's network where neither trainflow nor the user's project is installed.
    """
    import torch

    from training.model import factory

    model_config = torch.load(state_path, map_location="cpu", weights_only=True)["model_config"]
    entry = os.path.join(tmp, "trainflow_model.py")
    Path(entry).write_text(_ENTRY)
    example = input_example(spec, raw_rows) if raw_rows is not None else None
    return {
        "python_model": entry,
        "code_paths": [str(CODE_DIR), *factory.code_paths(model_config)],
        "artifacts": {STATE_ARTIFACT: str(state_path)},
        "signature": signature(spec, example),
        "input_example": example,
        "pip_requirements": requirements() + factory.requirements(model_config),
        # A key MLflow lets a loader override: load_model(uri, model_config={"device": "cpu"}).
        "model_config": {"device": None},
    }


def save(state: dict[str, Any], path: str, raw_rows: pd.DataFrame | None = None) -> str:
    """Save a trainflow state (weights, spec, model config) as a pyfunc model directory."""
    import mlflow.pyfunc
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        state_path = os.path.join(tmp, "state.pt")
        torch.save({k: v for k, v in state.items() if k != "optimizer"}, state_path)
        mlflow.pyfunc.save_model(path, **model_kwargs(state_path, state["spec"], raw_rows, tmp))
    return path


def pack(model_dir: str) -> dict[str, bytes]:
    """A model directory's files by relative path: they travel to Ray workers on any node."""
    root = Path(model_dir)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def load_packed(files: dict[str, bytes], directory: str, device: str | None = None):
    """Write packed files under ``directory`` and load them with ``mlflow.pyfunc.load_model``
    (on ``device``; None: MLflow's rule, the GPU when there is one)."""
    import mlflow.pyfunc

    for name, data in files.items():
        target = Path(directory) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return mlflow.pyfunc.load_model(directory, model_config={"device": device} if device else None)


def refusal(exc: BaseException) -> str:
    """The reason in an MLflow input error, without the dump of the data it carries."""
    text = str(exc)
    # "Failed to enforce schema of data '<the table>' with schema '<...>'. Error: <reason>"
    reason = text.rsplit("Error: ", 1)[-1] if "Failed to enforce schema" in text else text
    return one_line(reason, limit=300)


def predict(model, frame: pd.DataFrame) -> pd.DataFrame:
    """``model.predict(frame)``; a schema or input error becomes a DataValidationError."""
    from mlflow.exceptions import MlflowException

    try:
        return model.predict(frame)
    except MlflowException as exc:
        raise DataValidationError(f"the model refused the input: {refusal(exc)}") from None
