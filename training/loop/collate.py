"""A processed split's Ray Data batches as the loop's tensors: zero-copy, shuffled in chunks.

Profiled on B8 (1M rows, one worker, a model that does nothing; docs/benchmarks.md): Ray Data
hands out Arrow batches at ~1.1x the rate a torch ``DataLoader`` reads the same parquet files,
but two of its conveniences took half of that away. Its default collate turns the fixed-size
list column of features into a NumPy object array (one array per row) before stacking it, and
its ``local_shuffle_buffer_size`` re-concatenates and takes from an Arrow buffer for every
batch. Here the features column becomes one (rows x width) tensor over Arrow's own buffer,
and the shuffle is a seeded permutation of a chunk of several batches, fetched from Ray Data
as one batch (fewer, larger fetches are cheaper too).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from ray.data.collate_fn import ArrowBatchCollateFn

from training.data.token_lists import is_token_lists, padded_lists
from training.manifest import FEATURES, LABEL, SAMPLE_ID

#: Batches per chunk: the shuffle's window, as Ray's local buffer of 4 batches was, and more.
CHUNK_BATCHES = 16
#: A chunk stays under this many bytes whatever the row width (images).
CHUNK_BYTES = 64 * 1024**2


class SplitCollate(ArrowBatchCollateFn):
    """Arrow batch of a processed split -> {features: float32 (rows, width), label, sample_id};
    a text model's token ids are padded to the batch's longest row."""

    def __init__(self, label_dtype: torch.dtype = torch.int64) -> None:
        super().__init__()
        self.label_dtype = label_dtype

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        import warnings

        features = batch.column(FEATURES).combine_chunks()
        if is_token_lists(features):
            matrix = padded_lists(features)
        else:
            flat = features.flatten().to_numpy(zero_copy_only=False)
            matrix = flat.reshape(-1, features.type.list_size)
        with warnings.catch_warnings():
            # Arrow's buffers are read-only; ``rebatch`` hands the loop copies (cheap, per batch).
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return {
                FEATURES: torch.from_numpy(matrix).to(torch.float32),
                LABEL: _column(batch, LABEL).to(self.label_dtype),
                SAMPLE_ID: _column(batch, SAMPLE_ID).to(torch.int64),
            }


def _column(batch, name: str) -> torch.Tensor:
    return torch.from_numpy(batch.column(name).to_numpy())


def chunk_rows(batch_size: int, row_bytes: int) -> int:
    """Rows fetched from Ray Data at a time: whole batches, at most CHUNK_BATCHES or CHUNK_BYTES."""
    fits = CHUNK_BYTES // max(1, batch_size * row_bytes)
    return batch_size * max(1, min(CHUNK_BATCHES, fits))


def rebatch(
    chunks: Iterator[dict[str, torch.Tensor]],
    batch_size: int,
    seed: int | None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of ``batch_size`` rows cut from each chunk, in a seeded random order within the
    chunk when ``seed`` is given (the same seed and data give the same batches: resumable).
    Cut where the chunk is: on a GPU, Ray has already moved it there."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    for chunk in chunks:
        rows = len(chunk[LABEL])
        order = None
        if generator is not None:  # drawn on the CPU whatever the device: the same order
            order = torch.randperm(rows, generator=generator).to(chunk[LABEL].device)
        for first in range(0, rows, batch_size):
            if order is None:  # a copy too: a model may write into its input in place
                span = slice(first, first + batch_size)
                batch = {key: value[span].clone() for key, value in chunk.items()}
            else:
                index = order[first : first + batch_size]
                batch = {key: value[index] for key, value in chunk.items()}
            yield batch
