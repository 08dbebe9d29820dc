"""The Ray Data batch predictor: the registered pyfunc model, loaded once per actor.

Every scoring path (``trainflow predict``, ``trainflow evaluate``, the pipeline's evaluate stage)
goes through :class:`PyfuncPredictor`: the MLflow model's files travel to the actor (any node),
which loads them with ``mlflow.pyfunc.load_model`` — the same code, schema check included, that
an MLflow client or ``mlflow models serve`` runs.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator

import pandas as pd
import torch

from training import errors
from training.errors import ConfigError, TrainflowError
from training.tracking import flavour

#: The column of an evaluation batch holding the true label (the user's label column's values).
TRUE_LABEL = "__trainflow_true_label__"
CONFIDENCE = "confidence"


def _ours(exc: BaseException | None) -> TrainflowError | None:
    """The TrainflowError a Ray Data failure wraps (task error -> UDF error -> our error)."""
    queue, seen = [exc], set()
    while queue:
        current = queue.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, TrainflowError) and type(current).__module__.startswith("training"):
            return current
        # RayTaskError keeps the worker's exception as ``cause``; UDF errors chain theirs.
        queue += [getattr(current, "cause", None), current.__cause__, current.__context__]
    # An actor's UDF error reaches the driver as text only (Ray Data's UserCodeException keeps
    # the worker's traceback, not the exception): rebuild ours from its last line.
    found = re.findall(r"training\.errors\.(\w+): ([^\n]+)", str(exc))
    if found:
        name, message = found[-1]
        kind = getattr(errors, name, None)
        if isinstance(kind, type) and issubclass(kind, TrainflowError):
            return kind(message)
    return None


@contextlib.contextmanager
def our_errors() -> Iterator[None]:
    """Re-raise the TrainflowError (one message, naming the column) behind a Ray Data error."""
    try:
        yield
    except Exception as exc:
        found = _ours(exc)
        if found is None or found is exc:
            raise
        raise found from None


def single_actor():
    """The compute strategy of every prediction: one actor."""
    import ray.data

    # One model replica: the data is small next to the cost of another actor on 2 cores.
    return ray.data.ActorPoolStrategy(size=1)


def scoring_actor(use_gpu: bool) -> dict:
    """``map_batches`` options of the one scoring actor: with ``use_gpu`` it holds a GPU of its
    own (ResNet-18 scoring 30,000 images on one CPU thread took 474 s of a 652 s run). On a
    cluster without a GPU that actor could never start: an error now, not a hang."""
    if not use_gpu:
        return {"compute": single_actor()}
    import ray

    if float(ray.cluster_resources().get("GPU", 0.0)) < 1:
        raise ConfigError(
            "train.use_gpu is true but the Ray cluster has no GPU to score on; set "
            "train.use_gpu=false (or --set train.use_gpu=false)"
        )
    return {"compute": single_actor(), "num_gpus": 1}


def device_of(use_gpu: bool) -> str:
    """The device a scoring actor loads the model on: the GPU Ray gave it, else the CPU (a
    CPU actor on a GPU machine must not take a GPU Ray did not give it)."""
    return "cuda" if use_gpu else "cpu"


def joined(inputs, scored: pd.DataFrame):
    """The input columns (a DataFrame, or an Arrow table whose column types are kept), then
    the model's (a name taken by an input gets ``_model``)."""
    if isinstance(inputs, pd.DataFrame):
        out = inputs.reset_index(drop=True)
        for name in scored.columns:
            out[name if name not in out.columns else f"{name}_model"] = scored[name].to_numpy()
        return out
    import pyarrow as pa

    for name in scored.columns:
        column = name if name not in inputs.column_names else f"{name}_model"
        inputs = inputs.append_column(column, pa.array(scored[name].to_numpy()))
    return inputs


class PyfuncPredictor:
    """A Ray Data actor: loads the packed MLflow model once, then scores pandas batches.

    With ``label_column`` (evaluation) a batch comes back as the model's output plus the true
    label; otherwise (prediction) as the input columns plus the model's output and, for a
    classifier, its confidence.

    Ray Data hands it Arrow batches (``batch_format="pyarrow"``), which it turns into pandas
    itself, as ``pandas.read_parquet`` would: Ray's own pandas batches hold ArrowDtype columns
    (an image column of Python lists, ``int64[pyarrow]`` labels) that MLflow's schema check
    refuses ("Can not safely convert int64 to float64", 200,000 images).
    """

    def __init__(
        self,
        files: dict[str, bytes],
        label_column: str | None = None,
        threads: int | None = 1,
        device: str = "cpu",
    ):
        """``threads``: torch threads of the actor's process (None: leave them as they are);
        ``device``: where the model runs (see :func:`device_of`)."""
        if threads is not None:
            torch.set_num_threads(threads)
        self._dir = tempfile.mkdtemp(prefix="trainflow-model-")
        self.model = flavour.load_model(files, self._dir, device)
        self.classes = [c.name for c in self.model.metadata.get_output_schema().inputs][1:]
        self.label_column = label_column

    def __call__(self, batch):
        """Score a pandas batch or an Arrow batch (see the class's note)."""
        frame = batch if isinstance(batch, pd.DataFrame) else batch.to_pandas()
        if len(frame) == 0:  # an empty block; a table with no rows at all is refused elsewhere
            scored = pd.DataFrame({c: [] for c in [flavour.PREDICTION, *self.classes]})
        else:
            scored = flavour.predict(self.model, frame)
        if self.label_column is not None:
            scored[TRUE_LABEL] = frame[self.label_column].to_numpy()
            return scored
        if self.classes:  # a regression has no classes: its prediction is the number
            scored[CONFIDENCE] = scored[self.classes].max(axis=1)
        return joined(batch, scored)

    def __del__(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)
