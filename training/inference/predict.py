"""Predictions for raw rows: the inputs with the model's output appended (the predicted label,
one probability per class, and the confidence), streamed through the pyfunc model."""

from __future__ import annotations

from training.errors import DataValidationError
from training.inference.predictor import PyfuncPredictor, device_of, our_errors, scoring_actor
from training.storage import atomic_path

BATCH_ROWS = 1024


def predict_files(
    files_of_model: dict[str, bytes],
    files: list[str],
    output: str,
    fmt: str = "parquet",
    use_gpu: bool = False,
    constants: dict[str, str] | None = None,
    endpoint_url: str | None = None,
    sheet: str | int | None = None,
) -> int:
    """Score raw rows with a packed MLflow model (on a GPU with ``use_gpu``); write inputs +
    outputs (+ a column per ``constants`` entry, e.g. the model version), whole or nothing.
    ``endpoint_url``: the S3 endpoint of ``s3://`` files (storage.endpoint_url); ``sheet``: a
    workbook's sheet (data.sheet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.data.read import read_raw

    scored = read_raw(files, fmt, endpoint_url, sheet).map_batches(
        PyfuncPredictor,
        fn_constructor_kwargs={"files": files_of_model, "device": device_of(use_gpu)},
        batch_size=BATCH_ROWS,
        batch_format="pyarrow",  # converted by the predictor, as pandas.read_parquet does
        **scoring_actor(use_gpu),
    )
    rows = 0
    with our_errors(), atomic_path(output) as tmp:
        writer = None
        try:
            for table in scored.iter_batches(batch_size=4096, batch_format="pyarrow"):
                for name, value in (constants or {}).items():
                    table = table.append_column(name, pa.array([value] * table.num_rows))
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()  # a failed write is closed too, then removed by atomic_path
        if writer is None:
            raise DataValidationError(f"{files} hold no rows; nothing to predict")
    return rows
