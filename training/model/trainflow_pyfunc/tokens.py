"""The ``tokens`` step of the one transform: a text column -> token ids, by the tokenizer the spec
holds as plain data (a fast tokenizer's JSON, as ``tokenizers.Tokenizer.to_str`` writes it),
truncated to ``max_length`` and not padded: a row keeps its own length.

Batches are padded where they are made (``padded``): to the longest row of the batch, with
``PAD`` (-1), which no tokenizer gives as an id. The network (``hf.py``) turns ``PAD`` into the
attention mask and the tokenizer's pad id, and cuts a batch's columns past its longest row, so a
batch of short texts costs short sequences even where a whole split was padded to ``max_length``.

numpy, pandas and ``tokenizers`` only: the registered model applies it where trainflow is not
installed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .transform_steps import TransformError

#: A padded position: not a token.
PAD = -1
#: The spec key holding the tokens step's state (absent: no text column).
TOKENS = "tokens"


def tokens_state(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The spec's tokenizer state: {column, tokenizer (JSON), max_length, pad_id}, or None."""
    return spec.get(TOKENS) or None


@functools.lru_cache(maxsize=4)
def tokenizer_of(tokenizer_json: str, max_length: int | None):
    """The fast tokenizer of a JSON string, truncating to ``max_length`` (None: never),
    never padding."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    return tokenizer


def texts(frame: pd.DataFrame, column: str) -> list[str]:
    """The column's values as Python strings; anything else is one error naming the column."""
    values = frame[column].tolist()
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise TransformError(
            f"text column {column!r} holds {len(bad)} value(s) that are not text (e.g. "
            f"{bad[0]!r}); every row needs a string (drop or fill those rows)"
        )
    return values


def token_ids(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """A text column -> one int32 array of token ids per row (an object array [n])."""
    (column,) = columns
    state = spec[TOKENS]
    # A packed language model's texts are whole: packing cuts them into max_length blocks.
    limit = int(state["max_length"]) if state.get("truncate", True) else None
    tokenizer = tokenizer_of(state["tokenizer"], limit)
    encodings = tokenizer.encode_batch(texts(frame, column))
    rows = np.empty(len(encodings), dtype=object)
    for i, encoding in enumerate(encodings):
        rows[i] = np.asarray(encoding.ids, dtype=np.int32)
    return rows


def pad_flat(values: np.ndarray, lengths: np.ndarray, width: int | None = None) -> np.ndarray:
    """Rows given as their concatenated ids and lengths -> int64 [n, width] padded with PAD;
    ``width`` None: the longest row's length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    width = int(lengths.max(initial=0)) if width is None else int(width)
    out = np.full((len(lengths), width), PAD, dtype=np.int64)
    if len(values):
        rows = np.repeat(np.arange(len(lengths)), lengths)
        starts = np.cumsum(lengths) - lengths
        cols = np.arange(len(values)) - np.repeat(starts, lengths)
        out[rows, cols] = values
    return out


def padded(rows: np.ndarray, width: int | None = None) -> np.ndarray:
    """Rows of token ids (an object array of arrays) -> int64 [n, width] padded with PAD."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    values = np.concatenate(list(rows)) if len(rows) else np.zeros(0, dtype=np.int64)
    return pad_flat(values, lengths, width)
