"""A language model on prompt / response columns, without Ray: each row's ids are its
prompt part then its response part, the loss only on the response (checked against
transformers' own ``labels=-100`` loss and its chat template's assistant mask), packing keeps
the mask beside its ids, serving gives the model the prompt part it trained on, and the bad
inputs are each one clear error."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hf_fixtures import save_tokenizer

from training.config import DataConfig, validate_config
from training.data.packing import pack_blocks
from training.data.token_lists import token_lists
from training.errors import ConfigError, DataValidationError
from training.model import hf_resolve
from training.model.trainflow_pyfunc.causal_lm import (
    HFCausalLM,
    NextTokenLoss,
    next_tokens,
    target_count,
    token_values,
)
from training.model.trainflow_pyfunc.generation import end_id, served_ids
from training.model.trainflow_pyfunc.prompts import no_loss, pair_ids
from training.model.trainflow_pyfunc.tokens import PAD, padded, tokenizer_of

PROMPTS = ["Ad sales boost Time Warner profit", "Dollar gains on Greenspan speech"]
RESPONSES = [
    "Quarterly profits at US media giant TimeWarner jumped.",
    "The dollar has hit its highest level against the euro.",
]
TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 320, "n_embd": 16, "n_layer": 1, "n_head": 2}
TINY_GPT2["n_positions"] = 64


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("chat-tokenizer"))


def _state(directory, chat: bool, max_length: int = 64) -> dict:
    tokenizer = hf_resolve.pretrained_tokenizer(str(directory))
    state = {
        "tokenizer": tokenizer.backend_tokenizer.to_str(),
        "max_length": max_length,
        "pad_id": hf_resolve.pad_id(tokenizer),
        "prompt_column": "headline",
        "response_column": "lead",
    }
    if chat:
        state.update(hf_resolve.chat_template(tokenizer, str(directory)))
    return state


def _rows(state: dict) -> np.ndarray:
    frame = pd.DataFrame({"headline": PROMPTS, "lead": RESPONSES, "topic": ["b", "b"]})
    return pair_ids(frame, ["headline", "lead"], {"tokens": state})


def _tokens(state: dict, ids) -> list[str]:
    tokenizer = tokenizer_of(state["tokenizer"], None)
    return [tokenizer.id_to_token(int(i)) for i in ids]


def test_without_a_template_the_loss_covers_exactly_the_responses_tokens(chat_dir):
    state = _state(chat_dir, chat=False)
    tokenizer = tokenizer_of(state["tokenizer"], None)
    for row, prompt, response in zip(_rows(state), PROMPTS, RESPONSES, strict=True):
        head = tokenizer.encode(prompt).ids  # [CLS] prompt [SEP]
        rest = tokenizer.encode(response).ids[1:]  # response [SEP], its [CLS] dropped
        assert row.tolist() == no_loss(np.array(head)).tolist() + rest
        targets = next_tokens(torch.tensor(row[None, :]), len(row))[0]
        assert targets[targets != -100].tolist() == rest  # the response's tokens, and only them
        assert _tokens(state, rest)[-1] == "[SEP]"  # it learns where an answer ends


def test_with_a_chat_template_the_loss_covers_exactly_the_assistants_tokens(chat_dir):
    state = _state(chat_dir, chat=True)
    tokenizer = hf_resolve.pretrained_tokenizer(str(chat_dir))
    for row, prompt, response in zip(_rows(state), PROMPTS, RESPONSES, strict=True):
        chat = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        theirs = tokenizer.apply_chat_template(
            chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        values = token_values(torch.tensor(row)).tolist()
        assert values == list(theirs["input_ids"])  # the conversation as transformers has it
        assert (row >= 0).astype(int).tolist() == list(theirs["assistant_masks"])
        assert _tokens(state, values)[-1] == "<|end|>"


def test_packing_keeps_each_blocks_mask_beside_its_ids(chat_dir):
    state = {**_state(chat_dir, chat=False), "truncate": False}
    rows = _rows(state)
    table = pa.table(
        {
            "features": token_lists(rows),
            "label": np.zeros(2, np.int64),
            "sample_id": np.array([7, 9], np.int64),
            "split": ["train", "train"],
        }
    )
    blocks = pack_blocks(table, 5).column("features").to_pylist()
    assert all(len(b) == 5 for b in blocks[:-1])
    packed, whole = [i for b in blocks for i in b], np.concatenate(rows).tolist()
    assert packed == whole[: len(packed)] and len(whole) - len(packed) <= 1  # a 1-token tail
    # Every response token is a target of the block it lands in, save a block's first token.
    batch = torch.from_numpy(padded(np.array([np.array(b) for b in blocks], dtype=object)))
    response_tokens = sum(i >= 0 for i in packed)
    starts_in_response = sum(b[0] >= 0 for b in blocks)
    assert target_count(batch) == response_tokens - starts_in_response > 0


def test_a_long_row_keeps_its_start_when_not_packed(chat_dir):
    state = _state(chat_dir, chat=False, max_length=6)
    assert [len(r) for r in _rows(state)] == [6, 6]
    assert (_rows(state)[0] < PAD).all()  # a headline of 6 tokens or more: no target is left


def test_the_masked_loss_is_transformers_own_with_labels_minus_100_over_the_prompt():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_GPT2)).eval()
    network = HFCausalLM(model, pad_id=0)
    values = torch.randint(1, 320, (3, 12))
    prompt = torch.zeros_like(values, dtype=torch.bool)
    prompt[0, :4], prompt[1, :7], prompt[2, :1] = True, True, True
    ids = torch.where(prompt, -2 - values, values)
    ids[2, 9:] = PAD  # a shorter row, padded
    ours = NextTokenLoss()(network(ids.float()), ids.float()) / target_count(ids)
    labels = values.masked_fill(prompt | (ids == PAD), -100)
    attention = (ids != PAD).long()
    theirs = model(input_ids=values * attention, attention_mask=attention, labels=labels).loss
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    assert target_count(ids) == int((labels[:, 1:] != -100).sum())


@pytest.mark.parametrize("chat", [False, True])
def test_serving_gives_the_model_the_prompt_part_it_trained_on(chat_dir, chat):
    state = _state(chat_dir, chat=chat)
    tokenizer = tokenizer_of(state["tokenizer"], None)
    for row, prompt in zip(_rows(state), PROMPTS, strict=True):
        trained = (-2 - row[row < PAD]).tolist()
        assert served_ids(state, tokenizer, prompt, keep=100) == trained
        assert served_ids(state, tokenizer, prompt, keep=3) == trained[-3:]
    stop = "<|end|>" if chat else "[SEP]"  # the template's end of turn, else the tokenizer's
    assert end_id(tokenizer, state) == tokenizer.token_to_id(stop)


def _config(data: dict, tokenizer: str = "train"):
    hf = {"config": dict(TINY_GPT2), "tokenizer": tokenizer}
    return validate_config(
        {"data": {"task": "causal_lm", "max_length": 32, **data}, "model": {"kind": "hf", "hf": hf}}
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"prompt_column": "q"}, "set both data.prompt_column and data.response_column"),
        ({"response_column": "a"}, "set both data.prompt_column and data.response_column"),
        ({"chat_template": True}, "data.chat_template formats a prompt and a response"),
        ({"prompt_column": "q", "response_column": "q"}, "must be three different columns"),
        (
            {"prompt_column": "q", "response_column": "a", "chat_template": True},
            "model.hf.tokenizer: train fits a tokenizer that has none",
        ),
        (
            {"task": "auto", "prompt_column": "q", "response_column": "a"},
            "need data.task: causal_lm",
        ),
    ],
)
def test_bad_prompt_response_configs_are_one_clear_error(data, message):
    with pytest.raises(ConfigError) as error:
        _config(data)
    assert message in str(error.value)


def test_a_chat_template_asked_of_a_tokenizer_without_one_is_refused_at_preflight(tmp_path):
    from training.stages.preflight import check_hf

    plain = save_tokenizer(tmp_path / "plain", chat_template=None)
    data = {"prompt_column": "q", "response_column": "a", "chat_template": True}
    config = _config(data, tokenizer=str(plain))
    with pytest.raises(ConfigError, match="has no chat template") as error:
        check_hf(config)
    assert str(plain) in str(error.value) and "data.chat_template: false" in str(error.value)
    check_hf(_config(data, tokenizer=str(save_tokenizer(tmp_path / "chat"))))  # one: fine


def test_missing_prompt_or_response_columns_are_named_with_the_columns_present(tmp_path):
    from training.data.schema import check_schema

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"title": ["a b"], "body": ["c d"], "topic": ["x"]}), path)
    data = DataConfig(
        source=str(path),
        label_column="topic",
        task="causal_lm",
        prompt_column="title",
        response_column="answer",
    )
    with pytest.raises(DataValidationError) as error:
        check_schema(data, [str(path)], "parquet", None)
    text = str(error.value)
    assert "'answer' (data.response_column)" in text and "'title'" not in text.split(";")[0]
    assert "['title', 'body', 'topic']" in text


def test_the_bundled_headlines_are_a_prompt_and_its_lead():
    from training.data.builtin import bbc_headlines_frame, headline_and_lead

    article = "Dollar gains on Greenspan speech\n\nThe dollar has hit a high.\n\nMore text."
    assert headline_and_lead(article) == (
        "Dollar gains on Greenspan speech",
        "The dollar has hit a high.",
    )
    assert headline_and_lead("Only a title") == ("Only a title", "")
    frame = bbc_headlines_frame()
    assert list(frame.columns) == ["prompt", "response", "category"]
    assert len(frame) > 2000 and (frame["response"] != "").all()
    assert frame["prompt"].str.len().max() < frame["response"].str.len().median() * 3
