"""The bundled real data set: scikit-learn's 8x8 digits, written once as parquet.

Nothing downloads: the digits ship inside scikit-learn.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.storage import atomic_path

DIGITS_FILE = "digits.parquet"
DIGITS_SIDE = 8


@functools.lru_cache(maxsize=1)  # load_digits parses a gzipped CSV: once per process is enough
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels float32 [1797, 64] in 0..16, labels int64 [1797]), read-only."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels, labels = bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    pixels.flags.writeable = labels.flags.writeable = False  # shared by every caller
    return pixels, labels


def ensure_digits(home: Path) -> str:
    """Write the 1,797 digits to ``<home>/datasets/digits/digits.parquet`` once; return its path.

    Columns ``pixel_00`` ... ``pixel_63`` (float32, 0..16) and ``label`` (int64).
    """
    path = Path(home) / "datasets" / "digits" / DIGITS_FILE
    if not path.exists():
        pixels, labels = digits()
        columns = {f"pixel_{i:02d}": pixels[:, i] for i in range(pixels.shape[1])}
        columns["label"] = labels
        with atomic_path(path) as tmp:
            pq.write_table(pa.table(columns), tmp)
    return str(path)
