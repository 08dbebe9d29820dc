"""A seeded generator of digit-like images for scale tests and benchmarks: the bundled digits
upsampled, jittered and noised, as many rows and as large as asked, the same for the same seed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.data.builtin import DIGITS_SIDE, digits
from training.storage import atomic_path

# Rows generated per chunk: bounds memory and makes a table independent of how it is written.
_CHUNK_ROWS = 20_000


def _upsample_index(side: int) -> np.ndarray:
    return (np.arange(side) * DIGITS_SIDE) // side


def _chunk(
    n_rows: int, seed: int, chunk_index: int, side: int, tabular: bool, noise: float
) -> pa.Table:
    # One generator per (seed, chunk): the same rows whether built whole or written file by file.
    rng = np.random.default_rng([seed, chunk_index])
    pixels, labels = digits()
    pick = rng.integers(0, len(labels), size=n_rows)
    small = pixels[pick].reshape(n_rows, DIGITS_SIDE, DIGITS_SIDE) / 16.0
    idx = _upsample_index(side)
    images = small[:, idx][:, :, idx]
    # Jitter: shift each image by up to side/8 pixels (grouped by shift, so it stays vectorised).
    reach = max(1, side // 8)
    shifts = rng.integers(-reach, reach + 1, size=(n_rows, 2))
    for dy, dx in {tuple(s) for s in shifts.tolist()}:
        rows = np.flatnonzero((shifts[:, 0] == dy) & (shifts[:, 1] == dx))
        images[rows] = np.roll(images[rows], (dy, dx), axis=(1, 2))
    images += rng.normal(0.0, noise, size=images.shape).astype(np.float32)
    flat = np.clip(images, 0.0, 1.0).astype(np.float32).reshape(n_rows, side * side)
    label = pa.array(labels[pick], pa.int64())
    if tabular:
        width = len(str(side * side - 1))
        columns = {f"pixel_{i:0{width}d}": flat[:, i] for i in range(side * side)}
        columns["label"] = label
        return pa.table(columns)
    image = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), side * side)
    return pa.table({"image": image, "label": label})


def _chunks(n_rows: int, seed: int, side: int, tabular: bool, noise: float) -> Iterator[pa.Table]:
    if n_rows < 1 or side < 1:
        raise ValueError("n_rows and side must be >= 1")
    for index, start in enumerate(range(0, n_rows, _CHUNK_ROWS)):
        yield _chunk(min(_CHUNK_ROWS, n_rows - start), seed, index, side, tabular, noise)


def synthetic_images(
    n_rows: int, seed: int, side: int = 28, *, tabular: bool = False, noise: float = 0.1
) -> pa.Table:
    """Seeded digit-like images: upsampled, jittered digits plus Gaussian noise, in [0, 1].

    Columns ``image`` (fixed-size list of ``side*side`` float32) and ``label`` (int64), or with
    ``tabular=True`` one float32 column per pixel (``pixel_000`` ...) and ``label``.
    """
    return pa.concat_tables(_chunks(n_rows, seed, side, tabular, noise))


def write_synthetic(
    path: str | Path,
    n_rows: int,
    seed: int,
    side: int = 28,
    *,
    tabular: bool = False,
    noise: float = 0.1,
    num_files: int = 1,
) -> list[str]:
    """Write ``synthetic_images`` to parquet, chunk by chunk; return the files written.

    ``num_files=1``: ``path`` is the file. More: ``path`` is a directory of ``part-NNNNN.parquet``.
    """
    if num_files < 1:
        raise ValueError("num_files must be >= 1")
    path = Path(path)
    targets = (
        [path] if num_files == 1 else [path / f"part-{i:05d}.parquet" for i in range(num_files)]
    )
    per_file = -(-n_rows // num_files)
    tables = _chunks(n_rows, seed, side, tabular, noise)
    pending: pa.Table | None = None
    written = []
    for index, target in enumerate(targets):
        want = min(per_file, n_rows - index * per_file)
        if want <= 0:
            break
        with atomic_path(target) as tmp:
            writer = None
            while want > 0:
                if pending is None:
                    pending = next(tables)
                part, pending = pending.slice(0, want), pending.slice(want)
                pending = pending if pending.num_rows else None
                want -= part.num_rows
                writer = writer or pq.ParquetWriter(tmp, part.schema)
                writer.write_table(part)
            writer.close()
        written.append(str(target))
    return written
