"""What a logged model says about its input and output: the MLflow signature (raw columns in,
prediction and classes out) and a few raw rows as its input example."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from training.model.trainflow_pyfunc.causal_lm import CAUSAL_LM
from training.model.trainflow_pyfunc.generation import DEFAULT_PARAMS, GENERATED, PROMPT
from training.model.trainflow_pyfunc.model import (
    PREDICTION,
    class_columns,
    input_columns,
    labels_array,
)
from training.model.trainflow_pyfunc.prompts import PROMPT_COLUMN, is_prompt_response

if TYPE_CHECKING:
    import pandas as pd

EXAMPLE_ROWS = 5


def _column_type(series, role: str | None = None) -> Any:
    """The signature type of a raw column: text as string, datetimes as datetime, arrays as
    arrays. A number is of any width: MLflow refuses int64 for a double column ("can not safely
    convert"), so a numeric column is typed Any and the transform converts it (text in it is
    still one error naming the column)."""
    import numpy as np
    import pandas as pd
    from mlflow.types import DataType
    from mlflow.types.schema import AnyType, Array

    if pd.api.types.is_bool_dtype(series):
        return DataType.boolean
    if role == "numeric" or (role and pd.api.types.is_numeric_dtype(series)):
        return AnyType()
    if role == "datetime":
        is_time = pd.api.types.is_datetime64_any_dtype(series)
        return DataType.datetime if is_time else DataType.string
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
    from mlflow.types.schema import AnyType

    if spec.get("task") == CAUSAL_LM:
        return _lm_signature()
    columns = input_columns(spec)
    roles = spec.get("column_roles") or {}
    if spec.get("image_column"):
        # Arrays, encoded PNG/JPEG bytes or their base64 text (JSON): the transform tells apart.
        inputs = [ColSpec(AnyType(), columns[0])]
    elif example is not None:
        # A table's columns may have gaps wherever training imputed them: not required values
        # (a text model's text is: it has no gap to fill).
        inputs = [
            ColSpec(_column_type(example[c], roles.get(c)), c, required=_required(c, roles))
            for c in columns
        ]
    else:
        inputs = [ColSpec(DataType.double, c) for c in columns]
    kind = "f" if spec.get("task") == "regression" else labels_array(spec["classes"]).dtype.kind
    label_type = {"i": DataType.long, "f": DataType.double}.get(kind, DataType.string)
    outputs = [ColSpec(label_type, PREDICTION)]
    outputs += [ColSpec(DataType.double, c) for c in class_columns(list(spec["classes"]))]
    return ModelSignature(Schema(inputs), Schema(outputs))


def _lm_signature():
    """A language model's: a prompt in, its generated text out, the generation's settings as
    inference params (``predict(df, params={...})``, or ``params`` in a serving request)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema

    kinds = {int: DataType.long, float: DataType.double}
    params = [ParamSpec(k, kinds[type(v)], v) for k, v in DEFAULT_PARAMS.items()]
    return ModelSignature(
        Schema([ColSpec(DataType.string, PROMPT)]),
        Schema([ColSpec(DataType.string, GENERATED)]),
        ParamSchema(params),
    )


def lm_prompts(spec: dict[str, Any], raw_rows: pd.DataFrame, words: int = 8) -> list[str]:
    """Prompts of a language model from raw rows: the first ``words`` words of each text, or
    the prompt column's prompts whole."""
    tokens = spec["tokens"]
    if is_prompt_response(tokens):
        return [str(prompt) for prompt in raw_rows[tokens[PROMPT_COLUMN]]]
    column = tokens["column"]
    return [" ".join(str(text).split()[:words]) for text in raw_rows[column]]


def _required(column: str, roles: dict[str, str]) -> bool:
    return not roles or roles.get(column) == "text"


def input_example(spec: dict[str, Any], raw_rows: pd.DataFrame) -> pd.DataFrame:
    """A few raw rows of the columns the model reads, arrays as lists (JSON-able)."""
    if spec.get("task") == CAUSAL_LM:
        import pandas as pd

        return pd.DataFrame({PROMPT: lm_prompts(spec, raw_rows.head(EXAMPLE_ROWS))})
    example = raw_rows[input_columns(spec)].head(EXAMPLE_ROWS).reset_index(drop=True)
    if spec.get("image_column"):
        column = spec["image_column"]
        example[column] = [list(map(float, _flat(v))) for v in example[column]]
    return example


def _flat(value):
    import numpy as np

    return np.asarray(value, dtype=np.float64).ravel()
