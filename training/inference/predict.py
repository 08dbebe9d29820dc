"""Predictions for raw rows: the inputs with the predicted label and its confidence appended."""

from __future__ import annotations

from typing import Any

from training.errors import DataValidationError
from training.inference.predictor import BatchPredictor, single_actor
from training.storage import atomic_path


def predict_files(
    state: dict[str, Any], files: list[str], output: str, fmt: str = "parquet"
) -> int:
    """Score raw rows (same columns as training); write inputs + prediction, whole or nothing."""
    import pyarrow.parquet as pq

    from training.data.read import read_raw

    scored = read_raw(files, fmt).map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"state": state, "raw_input": True},
        batch_size=1024,
        batch_format="pandas",
        compute=single_actor(),
    )
    rows = 0
    with atomic_path(output) as tmp:
        writer = None
        try:
            for table in scored.iter_batches(batch_size=4096, batch_format="pyarrow"):
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
                rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()  # a failed write is closed too, then removed by atomic_path
        if writer is None:
            raise DataValidationError(f"{files} hold no rows; nothing to predict")
    return rows
