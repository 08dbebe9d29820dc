"""A registered language model's serving (``data.task: causal_lm``): a ``prompt`` column in,
``generated_text`` out, with ``max_new_tokens``, ``temperature`` and ``top_p`` as inference
params (the signature's params schema). Temperature 0 is greedy decoding: deterministic.

Each prompt is tokenized by the tokenizer the state holds (its trailing special tokens, e.g.
``[SEP]``, dropped: the model continues the text). A model trained on prompt / response
columns is given the prompt part its rows began with (``prompts.prompt_part``: the encoding
with its special tokens, or the chat template's generation prompt) and answers it. A prompt is
kept to its last tokens that fit the model's context with the new ones, and generated on its
own (no padding to get wrong).
transformers, tokenizers, torch, numpy and pandas only: it runs where trainflow is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .prompts import SPECIAL_TOKENS, is_prompt_response, prompt_part
from .tokens import tokenizer_of

PROMPT = "prompt"
GENERATED = "generated_text"
#: The inference params and their defaults (their types make the params schema).
DEFAULT_PARAMS: dict[str, Any] = {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0}
#: Tokens that end a text, by the tokenizers trainflow fits or commonly meets.
END_TOKENS = ("[SEP]", "</s>", "<|endoftext|>", "<eos>")


def inference_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The params with their defaults; a bad value is a ValueError naming it."""
    out = {**DEFAULT_PARAMS, **{k: v for k, v in (params or {}).items() if v is not None}}
    out["max_new_tokens"] = int(out["max_new_tokens"])
    out["temperature"], out["top_p"] = float(out["temperature"]), float(out["top_p"])
    if out["max_new_tokens"] < 1:
        raise ValueError(f"max_new_tokens={out['max_new_tokens']}: give at least 1")
    if out["temperature"] < 0 or not 0 < out["top_p"] <= 1:
        raise ValueError(
            f"temperature={out['temperature']}, top_p={out['top_p']}: temperature must be >= 0 "
            "(0: greedy) and top_p in (0, 1]"
        )
    return out


def prompt_ids(tokenizer, prompt: str, keep: int) -> list[int]:
    """A prompt's ids without trailing special tokens, its last ``keep`` at most."""
    encoding = tokenizer.encode(prompt)
    ids, special = list(encoding.ids), list(encoding.special_tokens_mask)
    while ids and special[-1]:
        ids.pop()
        special.pop()
    return ids[-keep:] if keep > 0 else ids


def end_id(tokenizer, tokens: Mapping[str, Any] | None = None) -> int | None:
    """The id generation stops at: the tokenizer's own end-of-text token where the state
    names it (a chat template's), else the first of END_TOKENS it has."""
    eos = ((tokens or {}).get(SPECIAL_TOKENS) or {}).get("eos_token")
    for token in (eos, *END_TOKENS) if eos else END_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return None


@torch.no_grad()
def generate_texts(
    network, tokens: Mapping[str, Any], prompts: list[str], params: Mapping[str, Any], device
) -> list[str]:
    """Each prompt's continuation as text (the generated tokens only, decoded)."""
    settings = inference_params(params)
    tokenizer = tokenizer_of(tokens["tokenizer"], None)
    model = network.model
    context = int(getattr(model.config, "n_positions", 0) or model.config.max_position_embeddings)
    new = min(settings["max_new_tokens"], context - 1)
    sampling = settings["temperature"] > 0
    options = {"do_sample": sampling, "max_new_tokens": new, "pad_token_id": network.pad_id}
    if sampling:
        options.update(temperature=settings["temperature"], top_p=settings["top_p"])
    texts = []
    stop = end_id(tokenizer, tokens)
    for prompt in prompts:
        ids = served_ids(tokens, tokenizer, prompt, context - new) or [network.pad_id]
        input_ids = torch.tensor([ids], device=device)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            eos_token_id=stop,
            **options,
        )
        texts.append(tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True))
    return texts


def served_ids(tokens: Mapping[str, Any], tokenizer, prompt: str, keep: int) -> list[int]:
    """What the model is given: a prompt / response model's prompt part, or the prompt's ids."""
    if not is_prompt_response(tokens):
        return prompt_ids(tokenizer, prompt, keep)
    ids = prompt_part(tokens, tokenizer, prompt)
    return ids[-keep:] if keep > 0 else ids
