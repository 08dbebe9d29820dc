"""The ``text`` table of ``trainflow make-data --kind text``: free text at any size for scale
runs, made of real sentences. Each row is one to four sentences resampled (with replacement)
from the BBC News articles of one topic (``builtin:bbc_news``): real text with a real topic, not
real articles. The same seed writes the same rows however it is chunked (one random stream per
(seed, chunk) of ``CHUNK_ROWS``).

Columns: ``text`` (string) and ``category`` (the topic the sentences came from).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from training.datasets.synthetic import write_chunks

_TEXT = 6
MAX_SENTENCES = 4
#: A sentence ends at ., ! or ? followed by white space; shorter pieces are not sentences.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_MIN_SENTENCE_CHARS = 20


@functools.lru_cache(maxsize=1)
def topic_sentences() -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
    """(topics, each topic's sentences as an object array), from the bundled articles."""
    from training.data.builtin import bbc_news_frame

    frame = bbc_news_frame()
    topics = tuple(sorted(frame["category"].unique()))
    pools = []
    for topic in topics:
        sentences = [
            s.strip()
            for article in frame.loc[frame["category"] == topic, "text"]
            for s in _SENTENCE_END.split(article)
            if len(s.strip()) >= _MIN_SENTENCE_CHARS
        ]
        pools.append(np.asarray(sentences, dtype=object))
    return topics, tuple(pools)


def text_chunk(n_rows: int, seed: int, index: int) -> pa.Table:
    """Chunk ``index`` of the text table."""
    rng = np.random.default_rng([seed, _TEXT, index])
    topics, pools = topic_sentences()
    topic = rng.integers(0, len(topics), n_rows)
    count = rng.integers(1, MAX_SENTENCES + 1, n_rows)
    texts = np.empty(n_rows, dtype=object)
    for t, pool in enumerate(pools):
        rows = np.flatnonzero(topic == t)
        picks = rng.integers(0, len(pool), (len(rows), MAX_SENTENCES))
        for row, chosen, k in zip(rows, pool[picks], count[rows], strict=True):
            texts[row] = " ".join(chosen[:k])
    labels = np.asarray(topics, dtype=object)[topic]
    return pa.table({"text": pa.array(texts, pa.string()), "category": pa.array(labels)})


def write_text(
    path: str | Path,
    n_rows: int,
    seed: int,
    *,
    num_files: int = 16,
    endpoint_url: str | None = None,
) -> list[str]:
    """Write the text table to ``num_files`` parquet files, streaming."""

    def maker(rows: int, index: int) -> pa.Table:
        return text_chunk(rows, seed, index)

    return write_chunks(path, n_rows, maker, num_files=num_files, endpoint_url=endpoint_url)
