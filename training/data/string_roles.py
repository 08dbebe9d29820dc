"""Which role a string column's training values give it where ``data.columns`` does not say:
free text, short text, id-like, or a category (None), with the reason said on the console.

- **free text**: on average at least ``TEXT_LENGTH`` characters, at least ``TEXT_SPACES`` of the
  values with a space (a review, a ticket): ``text``.
- **short text**: at least ``SHORT_MIN_ROWS`` values, at least ``SHORT_WORDS`` of them made of
  words (``made_of_words``), on average at least ``SHORT_LENGTH`` characters, and mostly
  distinct: at least ``SHORT_DISTINCT`` of the values distinct, or the ``data.max_categories``
  most frequent values cover under ``SHORT_COVERAGE`` of the rows (a categorical would see
  mostly unknown values). A car name, a product name, a job title: ``text``, so the words
  they share (the maker) carry signal.
- **id-like**: a distinct value in at least ``ID_DISTINCT`` of the rows of each batch of at
  least ``ID_MIN_ROWS`` (codes, hashes, UUIDs, e-mail addresses: not words): not used.

Free text is tried first, then short text, then id-like: a column of distinct names is text.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: A string column whose rows (at least ``ID_MIN_ROWS`` with a value) are nearly all distinct.
ID_DISTINCT = 0.95
ID_MIN_ROWS = 20
#: Free text: long strings, most with a space.
TEXT_LENGTH = 30
TEXT_SPACES = 0.5
#: Short text: enough values, most made of words, not too short, mostly distinct.
SHORT_MIN_ROWS = 20
SHORT_WORDS = 0.8
SHORT_LENGTH = 8
SHORT_DISTINCT = 0.5
SHORT_COVERAGE = 0.5
#: Distinct values per batch a column's share of values made of words is read from.
WORDS_SAMPLE = 1000
#: A word: two or more letters (any alphabet), apostrophes and hyphens inside allowed.
_WORD = r"[^\W\d_]{2,}(?:['\-][^\W\d_]+)*"
_ALNUM = r"[^\W_]"


@dataclass(frozen=True)
class Found:
    """A string column's role found by its values, and why (said on the console)."""

    role: str
    why: str
    free: bool = False  # long free text (the one ``model.kind: hf`` reads)


def made_of_words(values: pd.Series) -> np.ndarray:
    """Per value (text): whether words are at least half of its space-separated pieces and hold
    at least half of its letters and digits ("chevrolet chevelle malibu", "peugeot 504"; not
    "A-000123", "3f2a9c...", "bob@example.com", "12345")."""
    pieces = values.astype(str).reset_index(drop=True).str.split().explode()
    bare = pieces.str.strip(string.punctuation)
    word = bare.str.fullmatch(_WORD).fillna(False).astype(bool)
    chars = pieces.str.count(_ALNUM).fillna(0)
    parts = pd.DataFrame({"word": word, "all": pieces.notna(), "chars": chars})
    parts["word_chars"] = chars.where(word, 0)
    per_value = parts.groupby(level=0).sum()
    words_half = 2 * per_value["word"] >= per_value["all"]
    chars_half = 2 * per_value["word_chars"] >= per_value["chars"]
    wordy = words_half & chars_half & (per_value["word"] > 0)
    return wordy.reindex(range(len(values)), fill_value=False).to_numpy(dtype=bool)


def words_share(counts: pd.Series) -> float:
    """The share of rows whose value is made of words, from a batch's value counts (most
    frequent first): of the rows holding its ``WORDS_SAMPLE`` most frequent values."""
    counts = counts.head(WORDS_SAMPLE)
    if not len(counts) or not counts.sum():
        return 0.0
    wordy = made_of_words(pd.Series(counts.index.astype(str)))
    return float(counts.to_numpy()[wordy].sum() / counts.sum())


def _coverage(counts: dict[str, int], rows: int, most: int) -> float:
    """The share of rows the ``most`` most frequent values hold (a vocabulary's reach)."""
    top = sorted(counts.values(), reverse=True)[:most]
    return sum(top) / rows if rows else 1.0


def _short_text(shape: dict[str, Any], counts: dict[str, int], most: int) -> str | None:
    """Why a column is short text, or None where it is not."""
    rows = shape["rows"]
    length, words = shape["length"] / rows, shape["words"] / rows
    if rows < SHORT_MIN_ROWS or words < SHORT_WORDS or length < SHORT_LENGTH:
        return None
    distinct, coverage = len(counts) / rows, _coverage(counts, rows, most)
    if distinct < SHORT_DISTINCT and coverage >= SHORT_COVERAGE:
        return None
    spread = (
        f"{distinct:.0%} of its values distinct"
        if distinct >= SHORT_DISTINCT
        else f"its {most} most frequent values cover {coverage:.0%} of the rows"
    )
    return f"short text: {spread}, {words:.0%} made of words, {length:.0f} characters on average"


def string_role(shape: dict[str, Any] | None, counts: dict[str, int], most: int) -> Found | None:
    """The role a string column's summed shape (rows, distinct, length, spaces, words, big,
    big_distinct) and train value counts give it; ``most``: data.max_categories."""
    if not shape or not shape["rows"]:
        return None
    length, spaces = shape["length"] / shape["rows"], shape["spaces"] / shape["rows"]
    if length >= TEXT_LENGTH and spaces >= TEXT_SPACES:
        why = f"free text: {length:.0f} characters on average, {spaces:.0%} with a space"
        return Found("text", why, free=True)
    short = _short_text(shape, counts, most)
    if short:
        return Found("text", short)
    if shape["big"] and shape["big_distinct"] / shape["big"] >= ID_DISTINCT:
        return Found("id-like", "")
    return None
