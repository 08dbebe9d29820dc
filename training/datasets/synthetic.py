"""Seeded generators of real-size data for scale tests, benchmarks and ``trainflow make-data``.

Three tables, each the same for the same seed however it is written (rows are made in chunks of
``CHUNK_ROWS``, one random stream per (seed, kind, chunk), so memory stays flat and the rows do
not depend on the number of files):

- ``synthetic_images``: digit-like images (the bundled digits upsampled, jittered and noised);
- ``table``: N rows x 64 float32 features with a learnable label (a noisy linear teacher);
- ``color_images``: N 3x32x32 ``uint8`` images (coloured digit-like images) with labels.

``write_*`` stream chunks into many parquet files, on local disk or ``s3://``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.data.builtin import DIGITS_SIDE, digits
from training.errors import ServiceUnreachableError, StorageError
from training.storage import atomic_path, filesystem, is_remote, join

# Rows generated per chunk: bounds memory and makes a table independent of how it is written.
CHUNK_ROWS = 20_000
_CHUNK_ROWS = CHUNK_ROWS  # the name older callers used
# Streams of one seed: each kind of table draws from its own.
_DIGITS, _TABLE, _TEACHER, _COLOR = 0, 1, 2, 3
TABLE_FEATURES = 64
TABLE_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)


def _upsample_index(side: int) -> np.ndarray:
    return (np.arange(side) * DIGITS_SIDE) // side


def _digit_images(rng: np.random.Generator, n_rows: int, side: int, noise: float):
    """(float32 [n, side, side] in [0, 1], int64 labels [n]) drawn from ``rng``."""
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
    return np.clip(images, 0.0, 1.0).astype(np.float32), labels[pick]


def _chunk(
    n_rows: int, seed: int, chunk_index: int, side: int, tabular: bool, noise: float
) -> pa.Table:
    # One generator per (seed, chunk): the same rows whether built whole or written file by file.
    rng = np.random.default_rng([seed, chunk_index])
    images, labels = _digit_images(rng, n_rows, side, noise)
    flat = images.reshape(n_rows, side * side)
    label = pa.array(labels, pa.int64())
    if tabular:
        width = len(str(side * side - 1))
        columns = {f"pixel_{i:0{width}d}": flat[:, i] for i in range(side * side)}
        columns["label"] = label
        return pa.table(columns)
    image = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), side * side)
    return pa.table({"image": image, "label": label})


def _teacher(seed: int, n_features: int, n_classes: int) -> np.ndarray:
    """The label's linear teacher: fixed by the seed, shared by every chunk."""
    rng = np.random.default_rng([seed, _TEACHER, n_features, n_classes])
    return (rng.standard_normal((n_features, n_classes)) * 3.0 / np.sqrt(n_features)).astype(
        np.float32
    )


def _table_chunk(
    n_rows: int, seed: int, chunk_index: int, n_features: int, n_classes: int
) -> pa.Table:
    rng = np.random.default_rng([seed, _TABLE, chunk_index])
    x = rng.standard_normal((n_rows, n_features), dtype=np.float32)
    # A noisy linear teacher: an MLP learns it well above chance, but not perfectly.
    logits = x @ _teacher(seed, n_features, n_classes)
    logits += rng.gumbel(size=logits.shape).astype(np.float32)
    columns = {f"f{i:02d}": x[:, i] for i in range(n_features)}
    columns["label"] = pa.array(logits.argmax(axis=1), pa.int64())
    return pa.table(columns)


def _color_chunk(n_rows: int, seed: int, chunk_index: int) -> pa.Table:
    channels, side, _ = IMAGE_SHAPE
    rng = np.random.default_rng([seed, _COLOR, chunk_index])
    gray, labels = _digit_images(rng, n_rows, side, noise=0.1)
    # Each image its own foreground and background colour: the digit's shape carries the label.
    fg = rng.uniform(0.5, 1.0, size=(n_rows, channels, 1, 1)).astype(np.float32)
    bg = rng.uniform(0.0, 0.4, size=(n_rows, channels, 1, 1)).astype(np.float32)
    rgb = bg + (fg - bg) * gray[:, None, :, :]
    pixels = np.round(rgb * 255.0).astype(np.uint8).ravel()
    image = pa.FixedSizeListArray.from_arrays(pa.array(pixels), channels * side * side)
    return pa.table({"image": image, "label": pa.array(labels, pa.int64())})


def _chunks(n_rows: int, make: Callable[[int, int], pa.Table]) -> Iterator[pa.Table]:
    """``make(rows, chunk_index)`` for each chunk of ``n_rows``."""
    if n_rows < 1:
        raise ValueError("n_rows must be >= 1")
    for index, start in enumerate(range(0, n_rows, CHUNK_ROWS)):
        yield make(min(CHUNK_ROWS, n_rows - start), index)


def _digits_maker(seed: int, side: int, tabular: bool, noise: float):
    if side < 1:
        raise ValueError("side must be >= 1")
    return lambda rows, index: _chunk(rows, seed, index, side, tabular, noise)


def _table_maker(seed: int, n_features: int, n_classes: int):
    if n_features < 1 or n_classes < 2:
        raise ValueError("n_features must be >= 1 and n_classes >= 2")
    return lambda rows, index: _table_chunk(rows, seed, index, n_features, n_classes)


def synthetic_images(
    n_rows: int, seed: int, side: int = 28, *, tabular: bool = False, noise: float = 0.1
) -> pa.Table:
    """Seeded digit-like images: upsampled, jittered digits plus Gaussian noise, in [0, 1].

    Columns ``image`` (fixed-size list of ``side*side`` float32) and ``label`` (int64), or with
    ``tabular=True`` one float32 column per pixel (``pixel_000`` ...) and ``label``.
    """
    return pa.concat_tables(_chunks(n_rows, _digits_maker(seed, side, tabular, noise)))


def synthetic_table(
    n_rows: int, seed: int, n_features: int = TABLE_FEATURES, n_classes: int = TABLE_CLASSES
) -> pa.Table:
    """Columns ``f00`` ... (float32, standard normal) and ``label`` (int64, a noisy linear
    function of the features, ``n_classes`` classes). Whole in memory: for small tables."""
    return pa.concat_tables(_chunks(n_rows, _table_maker(seed, n_features, n_classes)))


def color_images(n_rows: int, seed: int) -> pa.Table:
    """Column ``image`` (fixed-size list of 3*32*32 uint8, channels first) and ``label``."""
    return pa.concat_tables(_chunks(n_rows, lambda rows, i: _color_chunk(rows, seed, i)))


def write_synthetic(
    path: str | Path,
    n_rows: int,
    seed: int,
    side: int = 28,
    *,
    tabular: bool = False,
    noise: float = 0.1,
    num_files: int = 1,
    endpoint_url: str | None = None,
) -> list[str]:
    """Write ``synthetic_images`` to parquet, chunk by chunk; return the files written.

    ``num_files=1``: ``path`` is the file. More: ``path`` is a directory of ``part-NNNNN.parquet``.
    """
    maker = _digits_maker(seed, side, tabular, noise)
    return write_chunks(path, n_rows, maker, num_files=num_files, endpoint_url=endpoint_url)


def write_table(
    path: str | Path,
    n_rows: int,
    seed: int,
    *,
    n_features: int = TABLE_FEATURES,
    n_classes: int = TABLE_CLASSES,
    num_files: int = 16,
    endpoint_url: str | None = None,
) -> list[str]:
    """Write ``synthetic_table`` rows to ``num_files`` parquet files, streaming."""
    maker = _table_maker(seed, n_features, n_classes)
    return write_chunks(path, n_rows, maker, num_files=num_files, endpoint_url=endpoint_url)


def write_color_images(
    path: str | Path,
    n_rows: int,
    seed: int,
    *,
    num_files: int = 16,
    endpoint_url: str | None = None,
) -> list[str]:
    """Write ``color_images`` rows to ``num_files`` parquet files, streaming."""

    def maker(rows: int, index: int) -> pa.Table:
        return _color_chunk(rows, seed, index)

    return write_chunks(path, n_rows, maker, num_files=num_files, endpoint_url=endpoint_url)


def write_chunks(
    path: str | Path,
    n_rows: int,
    make: Callable[[int, int], pa.Table],
    *,
    num_files: int = 1,
    endpoint_url: str | None = None,
) -> list[str]:
    """Stream the chunks of ``make`` into parquet: one file at ``path`` (``num_files=1``) or
    ``path/part-NNNNN.parquet``; a local path or ``s3://`` URI. Returns the files written.

    A local file appears whole (renamed into place); an S3 object when its upload completes.
    """
    if num_files < 1 or n_rows < 1:
        raise ValueError("num_files and n_rows must be >= 1")
    path = str(path)
    names = [f"part-{i:05d}.parquet" for i in range(num_files)]
    targets = [path] if num_files == 1 else [join(path, name) for name in names]
    per_file = -(-n_rows // num_files)
    tables = _chunks(n_rows, make)
    pending: pa.Table | None = None
    written = []
    for index, target in enumerate(targets):
        want = min(per_file, n_rows - index * per_file)
        if want <= 0:
            break

        def parts(want: int = want) -> Iterator[pa.Table]:
            nonlocal pending
            while want > 0:
                if pending is None:
                    pending = next(tables)
                part, rest = pending.slice(0, want), pending.slice(want)
                pending = rest if rest.num_rows else None
                want -= part.num_rows
                yield part

        _write_file(target, parts(), endpoint_url)
        written.append(target)
    return written


def _write_file(target: str, parts: Iterator[pa.Table], endpoint_url: str | None) -> None:
    try:
        if not is_remote(target):
            with atomic_path(target) as tmp:
                _write_parts(str(tmp), None, parts)
            return
        fs, key = filesystem(target, endpoint_url)
        try:
            _write_parts(key, fs, parts)
        except BaseException:
            # A failed upload may have completed a part of the object: leave nothing behind.
            with contextlib.suppress(OSError):
                fs.delete_file(key)
            raise
    except OSError as exc:
        kind = ServiceUnreachableError if is_remote(target) else StorageError
        raise kind(
            f"cannot write {target}: {exc}; check the path (the bucket must exist) and the S3 "
            "endpoint"
        ) from None


def _write_parts(where: str, fs, parts: Iterator[pa.Table]) -> None:
    writer = None
    try:
        for part in parts:
            # Random floats do not dictionary-encode: trying made writing 10x slower.
            writer = writer or pq.ParquetWriter(
                where, part.schema, filesystem=fs, use_dictionary=False
            )
            writer.write_table(part)
    finally:
        if writer is not None:
            writer.close()
