"""The ``text`` step of the one transform: a free-text column as a hashed bag of word and
character n-grams, so an MLP or a custom network can read it.

Per text column, per row: the text lowercased, cut into words (``WORD_PATTERN``, two or more
word characters, as scikit-learn's default), and counted as word unigrams and bigrams plus
character 3- to 5-grams of each word padded with one space either side (scikit-learn's
``char_wb``). Within word boundaries because the word bigrams already see across words, the
padding marks prefixes and suffixes (" un", "ing "), and the grams depend on the word alone:
they are computed once per distinct word of a batch, not once per character of the text. 100k
documents of 12 words take ~5 s on one core; 100k of ~60 words (``make-data --kind text``) ~30 s
on this project's shared 2-core machine, most of it in the regex and the gram strings.

Every gram is hashed with ``pandas.util.hash_array`` (SipHash-2-4 of the UTF-8 bytes under a
fixed key: the same number in every process, Python version and platform, unlike Python's
``hash()``), one key per family so a word and a gram of the same letters differ. The low bits
pick one of ``text_features`` buckets, the top bit a sign (signed hashing: collisions cancel
on average rather than pile up); a bucket's signed count ``c`` becomes ``sign(c) * (1 +
log|c|)`` (sublinear term frequency) and each row's block is scaled to unit L2 norm. The
transform's normalisation leaves these positions as they are (mean 0, std 1 in the spec): a
per-position standardisation would turn every empty bucket into a non-zero number.

Ray Data's ``HashingVectorizer`` preprocessor is not used: the registered model applies this
step to every request where Ray is not installed (numpy and pandas only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .transform_steps import TransformError

#: Buckets per text column where the spec does not say (``data.text_features``).
DEFAULT_TEXT_FEATURES = 2**12
WORD_PATTERN = r"\b\w\w+\b"
CHAR_NGRAMS = (3, 4, 5)
#: SipHash keys (16 characters) per family of grams.
_WORD_KEY = "trainflow-word-1"
_CHAR_KEY = "trainflow-char-1"
_BIGRAM_SALT = np.uint64(0x9E3779B97F4A7C15)
_SIGN_BIT = np.uint64(63)


def text_values(series: pd.Series, column: str) -> np.ndarray:
    """A text column as an object array of ``str`` (a missing text is the empty text); a value
    that is not text is one error naming the column and the value."""
    if pd.api.types.is_string_dtype(series) and series.dtype != object:
        return series.to_numpy(dtype=object, na_value="")
    present = series[series.notna()]
    if series.dtype == object:
        kind = pd.api.types.infer_dtype(present, skipna=True)
        if kind in ("string", "empty"):
            return series.to_numpy(dtype=object, na_value="")
        present = present[[not isinstance(v, str) for v in present]]
    example = present.iloc[0] if len(present) else None
    raise TransformError(
        f"text column {column!r} holds a value that is not text (e.g. {example!r}, type "
        f"{type(example).__name__}); give it strings, or declare its role in data.columns"
    )


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64, wrapping): spreads a combined hash over all 64 bits."""
    z = values ^ (values >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _char_grams(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes of every char n-gram of each word, in word order; each word's gram count)."""
    grams: list[str] = []
    counts = np.empty(len(words), dtype=np.int64)
    for i, word in enumerate(words):
        padded = f" {word} "
        before = len(grams)
        for n in CHAR_NGRAMS:
            grams.extend(padded[j : j + n] for j in range(len(padded) - n + 1))
        counts[i] = len(grams) - before
    hashed = pd.util.hash_array(np.array(grams, dtype=object), hash_key=_CHAR_KEY)
    return hashed, counts


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + length)`` for each pair, vectorised."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    offsets = np.repeat(starts - (ends - lengths), lengths)
    return offsets + np.arange(total, dtype=np.int64)


def gram_hashes(texts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row index, uint64 hash) of every word unigram, word bigram and char n-gram of the
    texts (an object array of str)."""
    tokens = pd.Series(texts, dtype=object).str.lower().str.findall(WORD_PATTERN)
    lengths = tokens.str.len().to_numpy(dtype=np.int64)
    rows = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
    flat = np.fromiter((w for words in tokens for w in words), dtype=object, count=len(rows))
    if not len(flat):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
    word_ids, words = pd.factorize(flat)
    words = np.asarray(words, dtype=object)
    unigram = pd.util.hash_array(words, hash_key=_WORD_KEY)[word_ids]
    same_row = rows[1:] == rows[:-1]
    bigram = _mix((unigram[:-1][same_row] * np.uint64(31)) ^ unigram[1:][same_row] ^ _BIGRAM_SALT)
    char_hashes, char_counts = _char_grams(words)
    word_starts = np.cumsum(char_counts) - char_counts
    per_token = char_counts[word_ids]
    chars = char_hashes[_ranges(word_starts[word_ids], per_token)]
    all_rows = np.concatenate([rows, rows[:-1][same_row], np.repeat(rows, per_token)])
    return all_rows, np.concatenate([unigram, bigram, chars])


def hashed_block(texts: np.ndarray, buckets: int) -> np.ndarray:
    """float64 [len(texts), buckets]: signed, sublinear, unit-L2 counts of the hashed grams
    (an empty text is a row of zeros)."""
    rows, hashes = gram_hashes(texts)
    bucket = (hashes % np.uint64(buckets)).astype(np.int64)
    sign = np.where((hashes >> _SIGN_BIT) == 1, -1.0, 1.0)
    counts = np.bincount(rows * buckets + bucket, weights=sign, minlength=len(texts) * buckets)
    # The block is mostly zeros: the log and the norms touch the non-zero cells only (a bucket
    # whose signs cancelled stays 0).
    cells = np.flatnonzero(counts)
    values = counts[cells]
    values = np.sign(values) * (1.0 + np.log(np.abs(values)))
    row_of_cell = cells // buckets
    norms = np.sqrt(np.bincount(row_of_cell, weights=values * values, minlength=len(texts)))
    counts[cells] = values / norms[row_of_cell]
    return counts.reshape(len(texts), buckets)


def text_width(spec: Mapping[str, Any]) -> int:
    """Feature positions per text column."""
    return int(spec.get("text_features") or DEFAULT_TEXT_FEATURES)


def hashed_text(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """Each text column's hashed block, side by side (float64 [n, text_width * columns])."""
    width = text_width(spec)
    blocks = [hashed_block(text_values(frame[c], c), width) for c in columns]
    return np.hstack(blocks) if blocks else np.zeros((len(frame), 0))
