"""A language model's prompt / response rows (``data.prompt_column`` and
``data.response_column``): one transform, applied by training to each row and by the registered
model to each prompt it is asked to continue, so the model is served the prefix it trained on.

A row's ids are its *prompt part* then its *response part*:

- plain: the prompt part is the tokenizer's encoding of the prompt with its special tokens
  (``[CLS] prompt [SEP]`` for a tokenizer trainflow fits), the response part the response's
  encoding without its leading ones (``response [SEP]``);
- chat template (``data.chat_template``): the prompt part is the tokenizer's chat template
  rendered for the user's turn with ``add_generation_prompt=True``, the response part the rest
  of the rendering of both turns (the assistant's answer and what closes it), each tokenized
  without added special tokens (the template writes them).

The loss is on the response part only: a prompt id is stored as ``-2 - id`` (``NO_LOSS``;
``tokens.PAD`` = -1 is no token at all), so the ids and the mask are one column that packing
cuts and batches pad together. The network reads the ids back (``causal_lm.token_values``).

numpy, pandas, ``tokenizers`` and (for a chat template) transformers only: it runs where
trainflow is not installed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from .tokens import TOKENS, texts, token_ids, tokenizer_of
from .transform_steps import TransformError

#: The tokens state's keys of a prompt / response model (absent: one text column).
PROMPT_COLUMN, RESPONSE_COLUMN = "prompt_column", "response_column"
#: The tokens state's chat template (a Jinja string) and the special tokens it may name.
CHAT_TEMPLATE, SPECIAL_TOKENS = "chat_template", "special_tokens"


def is_prompt_response(state: Mapping[str, Any]) -> bool:
    """True for a model trained on prompt / response columns."""
    return bool(state.get(RESPONSE_COLUMN))


def token_columns(state: Mapping[str, Any]) -> list[str]:
    """The raw columns the tokens step reads: the text column, or the prompt and response."""
    if is_prompt_response(state):
        return [state[PROMPT_COLUMN], state[RESPONSE_COLUMN]]
    return [state["column"]]


def described(state: Mapping[str, Any]) -> str:
    """The columns as the preprocess line names them."""
    if not is_prompt_response(state):
        return f"text {state['column']!r}"
    chat = " in the tokenizer's chat template" if state.get(CHAT_TEMPLATE) else ""
    return (
        f"prompt {state[PROMPT_COLUMN]!r} and response {state[RESPONSE_COLUMN]!r}{chat} "
        "(the loss on the response)"
    )


def no_loss(ids: np.ndarray) -> np.ndarray:
    """Ids the loss does not predict, as stored: ``-2 - id`` (below ``tokens.PAD``)."""
    return -2 - ids


@functools.lru_cache(maxsize=4)
def _renderer(tokenizer_json: str, template: str, special: tuple[tuple[str, str], ...]):
    """A transformers tokenizer that renders ``template`` (its special tokens as variables)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(tokenizer_json)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, chat_template=template, **dict(special)
    )


def _render(state: Mapping[str, Any], messages: list[dict[str, str]], generation: bool) -> str:
    special = tuple(sorted((state.get(SPECIAL_TOKENS) or {}).items()))
    renderer = _renderer(state["tokenizer"], state[CHAT_TEMPLATE], special)
    return renderer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def chat_texts(state: Mapping[str, Any], prompt: str, response: str | None) -> tuple[str, str]:
    """(the prompt part's text, the response part's text) of a row in the chat template."""
    user = [{"role": "user", "content": prompt}]
    head = _render(state, user, generation=True)
    if response is None:
        return head, ""
    whole = _render(state, [*user, {"role": "assistant", "content": response}], False)
    if not whole.startswith(head):
        raise TransformError(
            "the tokenizer's chat template does not render a conversation as its generation "
            "prompt followed by the answer, so the answer's tokens cannot be told apart; use "
            "a tokenizer whose template does, or set data.chat_template: false"
        )
    return head, whole[len(head) :]


def prompt_part(state: Mapping[str, Any], tokenizer, prompt: str) -> list[int]:
    """The ids a prompt becomes before its response: what the served model continues."""
    if state.get(CHAT_TEMPLATE):
        head, _ = chat_texts(state, prompt, None)
        return list(tokenizer.encode(head, add_special_tokens=False).ids)
    return list(tokenizer.encode(prompt).ids)


def _parts(state: Mapping[str, Any], tokenizer, prompts: list[str], responses: list[str]):
    """Each row's (prompt part, response part) encodings."""
    if state.get(CHAT_TEMPLATE):
        pairs = [chat_texts(state, p, r) for p, r in zip(prompts, responses, strict=True)]
        heads = tokenizer.encode_batch([h for h, _ in pairs], add_special_tokens=False)
        rests = tokenizer.encode_batch([r for _, r in pairs], add_special_tokens=False)
        return [e.ids for e in heads], [e.ids for e in rests]
    heads = tokenizer.encode_batch(prompts)
    rests = []
    for encoding in tokenizer.encode_batch(responses):
        ids, special = encoding.ids, encoding.special_tokens_mask
        lead = next((i for i, s in enumerate(special) if not s), len(ids))
        rests.append(ids[lead:])  # e.g. a fitted tokenizer's [CLS]: the prompt opened the row
    return [e.ids for e in heads], rests


def pair_ids(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """Prompt and response columns -> one int32 array per row: the prompt part's ids stored as
    ``no_loss``, then the response part's; cut to ``max_length`` unless packed."""
    state = spec[TOKENS]
    prompt_column, response_column = columns
    tokenizer = tokenizer_of(state["tokenizer"], None)
    heads, rests = _parts(
        state, tokenizer, texts(frame, prompt_column), texts(frame, response_column)
    )
    limit = int(state["max_length"]) if state.get("truncate", True) else None
    rows = np.empty(len(heads), dtype=object)
    for i, (head, rest) in enumerate(zip(heads, rests, strict=True)):
        ids = np.concatenate(
            [no_loss(np.asarray(head, dtype=np.int32)), np.asarray(rest, dtype=np.int32)]
        )
        rows[i] = ids[:limit]  # a long row keeps its start, as a truncated text does
    return rows


def row_ids(frame: pd.DataFrame, columns: list[str], spec: Mapping[str, Any]) -> np.ndarray:
    """The ``tokens`` step: a text column's ids, or a prompt / response row's."""
    if is_prompt_response(spec[TOKENS]):
        return pair_ids(frame, columns, spec)
    return token_ids(frame, columns, spec)
