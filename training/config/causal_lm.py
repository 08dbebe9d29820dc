"""The cross-checks of a language model's config (``data.task: causal_lm``): what the task
needs (a Hugging Face model; a tokenizer that can have a chat template where one is asked for)
and which keys a sweep may vary (the loop's and the Hugging Face model's: a language model has
no MLP to resize)."""

from __future__ import annotations

from typing import Any

CAUSAL_LM = "causal_lm"
#: Sweep keys a language model has: the loop's knobs and ``model.hf.*`` (LoRA's rank ...).
SWEEPABLE_PREFIXES = ("train.", "model.hf.")


def check_causal_lm(config: Any, default_space: dict[str, Any]) -> None:
    """ValueError naming the key for a config the causal-LM task cannot run."""
    if config.data.task != CAUSAL_LM:
        return
    if config.model.kind != "hf":
        raise ValueError(
            f"data.task=causal_lm trains a Hugging Face language model: set model.kind: hf "
            f"(with model.hf), not {config.model.kind}"
        )
    if config.data.chat_template and config.model.hf.tokenizer == "train":
        raise ValueError(
            "data.chat_template formats rows with the tokenizer's own chat template, and "
            "model.hf.tokenizer: train fits a tokenizer that has none; give a tokenizer "
            "directory or hub id with a chat template, or set data.chat_template: false"
        )
    sweep = config.sweep
    if sweep.search_space == default_space:  # the classifier's default: not the task's keys
        sweep.search_space = {
            k: v for k, v in default_space.items() if k.startswith(SWEEPABLE_PREFIXES)
        }
    for key in sweep.search_space:
        if not key.startswith(SWEEPABLE_PREFIXES):
            raise ValueError(
                f"sweep.search_space key {key!r} is not a key of data.task=causal_lm; sweep "
                "train.* (e.g. train.lr, train.warmup_ratio) or model.hf.* (e.g. "
                "model.hf.lora.r)"
            )
