"""Scheduled scoring (the ``pipeline/score`` deployment, flows/score.py): a table location,
local or ``s3://``, scored with the registered model's champion through Ray Data and the
registered pyfunc (the same path as ``trainflow predict``); the predictions written beside the
input with the version that made them, the rows and seconds on an MLflow run."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass

from training import progress
from training.config import DataConfig, PipelineConfig, registered_model_name
from training.data.formats import SUFFIXES, file_suffix
from training.data.inputs import input_format, resolve_inputs
from training.errors import ModelNotFoundError
from training.inference.predict import predict_files
from training.stages.connect import connect_ray
from training.storage import filesystem, is_remote
from training.tracking import flavour, registry, store
from training.tracking.runs import RUN_ID_TAG, STAGE_TAG, Tracker

#: The column of every prediction that names the model version that made it.
VERSION_COLUMN = "model_version"


@dataclass(frozen=True)
class Scored:
    """One scoring run: what was scored with which version, where it went, how long it took."""

    source: str
    output: str
    model: str
    version: str
    rows: int
    seconds: float
    mlflow_run_id: str

    def to_dict(self) -> dict:
        return asdict(self)


def predictions_location(source: str, version: str) -> str:
    """Beside the input: ``/data/new.parquet`` -> ``/data/new.scored-v3.parquet``, a directory
    ``s3://b/in/`` -> ``s3://b/in.scored-v3.parquet`` (scoring again with the same version
    replaces it)."""
    base = source.rstrip("/")
    suffix = file_suffix(base)
    if suffix in SUFFIXES:  # new.csv.gz -> new.scored-v3.parquet
        base = base[: -len(suffix)]
    return f"{base}.scored-v{version}.parquet"


def champion_version(tracker: Tracker, config: PipelineConfig) -> tuple[str, str]:
    """(registered model name, the version its champion alias names)."""
    name = registered_model_name(config)
    champion = registry.current_champion(tracker, name)
    if champion is None:
        raise ModelNotFoundError(
            f"registered model {name!r} has no champion to score with; train one with "
            "`trainflow run` (or set mlflow.registered_model)"
        )
    return name, champion.version


def score(config: PipelineConfig, source: str, run_id: str) -> Scored:
    """Score ``source`` with the champion; write the predictions beside it; log the run."""
    started = time.perf_counter()
    endpoint = config.storage.endpoint_url
    tracker = store.configure(config)
    name, version = champion_version(tracker, config)
    data = DataConfig(source=source, label_column="__none__", format=config.data.format)
    files = resolve_inputs(data, endpoint)
    output = predictions_location(files[0] if source.startswith("builtin:") else source, version)
    packed = flavour.resolve(config, f"models:/{name}/{version}")
    run = tracker.client.create_run(
        tracker.experiment_id,
        run_name=f"score-{run_id}",
        tags={STAGE_TAG: "score", RUN_ID_TAG: run_id, "trainflow.model_version": version},
    )
    mlflow_run = run.info.run_id
    tracker.log_params(mlflow_run, {"source": source, "output": output, "model": name})
    try:
        connect_ray(config)
        rows = _predict(packed.files, files, output, input_format(data, files), config, version)
    except BaseException:
        tracker.end_run(mlflow_run, "FAILED")
        raise
    seconds = round(time.perf_counter() - started, 2)
    tracker.log_metrics(mlflow_run, {"rows": rows, "seconds": seconds})
    tracker.end_run(mlflow_run, "FINISHED")
    progress.report(
        "score", f"{rows:,} rows scored with {name} version {version} in {seconds:.1f} s: {output}"
    )
    return Scored(source, output, name, version, rows, seconds, mlflow_run)


def _predict(model_files, files, output: str, fmt: str, config: PipelineConfig, version: str):
    """Predictions to ``output``: written in place locally, uploaded whole to S3."""
    constants = {VERSION_COLUMN: version}
    use_gpu = config.train.use_gpu
    endpoint, sheet = config.storage.endpoint_url, config.data.sheet
    if not is_remote(output):
        return predict_files(model_files, files, output, fmt, use_gpu, constants, endpoint, sheet)
    import pyarrow.fs as pafs

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "predictions.parquet")
        rows = predict_files(model_files, files, local, fmt, use_gpu, constants, endpoint, sheet)
        fs, path = filesystem(output, endpoint)
        pafs.copy_files(local, path, destination_filesystem=fs)
    return rows
