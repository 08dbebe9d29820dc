"""A language model on prompt / response rows end to end without the services: BBC
News headlines and their leads preprocessed by Ray Data (a fitted tokenizer, packed blocks),
trained by the loop for three epochs on a tiny GPT-2, its validation loss the response tokens'
only (equal to transformers' own ``labels=-100`` loss over the prompts), and the trained state
served: a headline in, a lead out."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from training.config import validate_config
from training.data.builtin import bbc_headlines_frame
from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import preprocess
from training.data.read import load_split_arrays
from training.errors import DataValidationError
from training.loop.loop import loop_config, run_loop
from training.model.trainflow_pyfunc.causal_lm import token_values
from training.model.trainflow_pyfunc.model import TrainflowModel
from training.model.trainflow_pyfunc.tokens import PAD, tokenizer_of

pytestmark = pytest.mark.integration

TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 600, "n_embd": 32, "n_layer": 2, "n_head": 2}
TINY_GPT2["n_positions"] = 48
GREEDY = {"max_new_tokens": 8, "temperature": 0.0}


def _config(source: str, **data):
    raw = {
        "data": {
            "source": source,
            "label_column": "category",
            "task": "causal_lm",
            "prompt_column": "prompt",
            "response_column": "response",
            "max_length": 48,
            **data,
        },
        "model": {"kind": "hf", "hf": {"config": dict(TINY_GPT2), "tokenizer": "train"}},
        "train": {"batch_size": 16, "lr": 0.01, "warmup_ratio": 0.0},
    }
    return validate_config(raw)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("headlines") / "headlines.parquet"
    bbc_headlines_frame().iloc[::8].reset_index(drop=True).to_parquet(path)  # 279, all topics
    return str(path)


@pytest.fixture(scope="module")
def prepared(ray_local, layout, table):
    config = _config(table)
    files = resolve_inputs(config.data)
    return config, preprocess(config, layout, fingerprint(config.data, files), files)


class _InMemory:
    """The loop's context over two splits held here (one process, no Ray Train)."""

    world_size, rank, strategy = 1, 0, "ddp"

    def __init__(self, manifest):
        self.split = {s: load_split_arrays(manifest, s)[:2] for s in ("train", "val")}
        self.reports = []

    def train_batches(self, epoch, batch_size, start=0):
        features, labels = self.split["train"]
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
        for first in range(start * batch_size, len(order), batch_size):
            index = order[first : first + batch_size]
            yield torch.from_numpy(features)[index], torch.from_numpy(labels)[index]

    def val_batches(self, batch_size):
        features, labels = self.split["val"]
        for first in range(0, len(labels), batch_size):
            yield (
                torch.from_numpy(features[first : first + batch_size]),
                torch.from_numpy(labels[first : first + batch_size]),
            )

    def prepare_model(self, model):
        return model

    def all_reduce_sum(self, values):
        return values

    def latest_state(self):
        return None

    def report(self, metrics, state):
        self.reports.append((metrics, state))


def test_a_prompt_response_run_trains_on_the_responses_and_serves_a_headline(prepared):
    config, manifest = prepared
    assert manifest.spec.tokens["prompt_column"] == "prompt"
    ctx = _InMemory(manifest)
    val = torch.from_numpy(ctx.split["val"][0])
    assert (val < PAD).any() and (val >= 0).any()  # stored blocks hold prompts and responses
    history = run_loop(loop_config(config, manifest.spec, 3, split_rows=manifest.rows), ctx)
    assert history[-1]["val_loss"] < history[0]["val_loss"], history

    model = TrainflowModel()
    model.load_state(ctx.reports[-1][1])
    model.network.eval()
    values = token_values(val)
    attention = (val != PAD).long()
    labels = values.masked_fill(val < 0, -100)  # the prompts and the padding: not predicted
    with torch.no_grad():
        theirs = model.network.model(
            input_ids=values * attention, attention_mask=attention, labels=labels
        ).loss.item()
    assert history[-1]["val_loss"] == pytest.approx(theirs, rel=1e-4)

    # Served: the headline as its rows began ([CLS] headline [SEP]), continued greedily.
    headline = "Dollar gains on Greenspan speech"
    out = model.predict(None, pd.DataFrame({"prompt": [headline]}), params=GREEDY)
    tokenizer = tokenizer_of(manifest.spec.tokens["tokenizer"], None)
    ids = torch.tensor([tokenizer.encode(headline).ids])
    assert tokenizer.id_to_token(int(ids[0, -1])) == "[SEP]"
    with torch.no_grad():
        new = model.network.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=GREEDY["max_new_tokens"],
            eos_token_id=tokenizer.token_to_id("[SEP]"),
            pad_token_id=model.network.pad_id,
        )[0, ids.shape[1] :]
    assert out["generated_text"][0] == tokenizer.decode(new.tolist(), skip_special_tokens=True)


def test_missing_prompt_or_response_columns_stop_preprocessing_naming_them(
    ray_local, tmp_path, table
):
    from training.storage import StorageLayout

    config = _config(table, response_column="lead")
    files = resolve_inputs(config.data)
    with pytest.raises(DataValidationError, match=r"no column 'lead' \(data.response_column\)"):
        preprocess(config, StorageLayout(root=str(tmp_path)), "x", files)
