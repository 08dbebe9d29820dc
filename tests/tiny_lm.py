"""A tiny GPT-2 language model on 60 BBC News articles: the config and the preprocessed data the
integration tests of the causal-LM loop share (FSDP, DeepSpeed)."""

from __future__ import annotations

import json

from training.config.overrides import load_config

TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 300, "n_embd": 32, "n_layer": 2, "n_head": 2}
TINY_GPT2.update(n_positions=64)
SETS = [
    "data.label_column=category",
    "data.task=causal_lm",
    "data.max_length=32",
    "model.kind=hf",
    f"model.hf={json.dumps({'config': TINY_GPT2, 'tokenizer': 'train'})}",
    "train.num_workers=2",
    "train.max_epochs=1",
    "train.batch_size=16",
    "train.lr=0.01",
]


def lm_config(source: str, *sets: str):
    return load_config(None, [f"data.source={source}", *SETS, *sets])


def bbc_manifest(layout, directory):
    """60 BBC News articles preprocessed for the tiny GPT-2: (manifest, source file)."""
    from training.data.builtin import bbc_news_frame
    from training.data.inputs import fingerprint, resolve_inputs
    from training.data.preprocess import preprocess

    source = directory / "bbc.parquet"
    bbc_news_frame().sample(n=60, random_state=0).reset_index(drop=True).to_parquet(source)
    config = lm_config(str(source))
    files = resolve_inputs(config.data)
    return preprocess(config, layout, fingerprint(config.data, files), files), str(source)
