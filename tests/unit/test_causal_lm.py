"""The causal-LM pieces without Ray: packing texts into blocks, the next-token targets and loss
(equal to transformers' own), the task's metrics and the config errors of a causal LM."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from training.config import validate_config
from training.data.packing import block_bounds, pack_blocks
from training.data.token_lists import token_lists
from training.errors import ConfigError
from training.loop.validation import perplexity
from training.model.trainflow_pyfunc.causal_lm import (
    HFCausalLM,
    NextTokenLoss,
    next_tokens,
    target_count,
)
from training.model.trainflow_pyfunc.tokens import PAD

TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 50, "n_embd": 16, "n_layer": 1, "n_head": 2}
TINY_GPT2["n_positions"] = 32


def _lm(**overrides):
    raw = {
        "data": {"task": "causal_lm", "max_length": 16},
        "model": {"kind": "hf", "hf": {"config": dict(TINY_GPT2), "tokenizer": "train"}},
    }
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    return raw


def _rows(*lengths: int, start: int = 0) -> np.ndarray:
    rows = np.empty(len(lengths), dtype=object)
    for i, n in enumerate(lengths):
        rows[i] = np.arange(start, start + n, dtype=np.int32)
        start += n
    return rows


def test_packing_concatenates_a_splits_texts_into_blocks_and_never_mixes_splits():
    rows = _rows(5, 3, 7)
    table = pa.table(
        {
            "features": token_lists(rows),
            "label": np.zeros(3, np.int64),
            "sample_id": np.array([100, 200, 300], np.int64),
            "split": ["train", "val", "train"],
        }
    )
    out = pack_blocks(table, 4).to_pydict()
    # train: texts 0-4 and 8-14 -> [0..3], [4, 8, 9, 10], [11..14]; val alone: [5, 6, 7].
    assert out["features"] == [[0, 1, 2, 3], [4, 8, 9, 10], [11, 12, 13, 14], [5, 6, 7]]
    assert out["split"] == ["train", "train", "train", "val"]
    assert out["sample_id"] == [100, 104, 303, 200]  # the row a block starts in, moved on
    assert len(set(out["sample_id"])) == 4


def test_a_one_token_tail_is_dropped_it_has_no_next_token():
    assert block_bounds(9, 4).tolist() == [0, 4]
    assert block_bounds(10, 4).tolist() == [0, 4, 8]
    assert block_bounds(1, 4).tolist() == []


def test_next_token_targets_skip_padding_and_each_rows_last_token():
    ids = torch.tensor([[5, 6, 7], [8, 9, PAD]])
    assert next_tokens(ids, 3).tolist() == [[6, 7, -100], [9, -100, -100]]
    assert target_count(ids) == 3


def test_the_loss_is_transformers_own_causal_lm_loss():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_GPT2)).eval()
    network = HFCausalLM(model, pad_id=0)
    ids = torch.randint(1, 50, (3, 10))
    ours = NextTokenLoss()(network(ids), ids) / target_count(ids)
    theirs = model(input_ids=ids, labels=ids).loss
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)


def test_perplexity_is_the_exponential_of_the_loss_and_inf_when_diverged():
    assert perplexity(math.log(20.0)) == pytest.approx(20.0)
    assert perplexity(1e4) == math.inf


def test_the_task_ranks_by_val_loss_and_gates_on_test_perplexity():
    config = validate_config(_lm())
    assert (config.sweep.metric, config.sweep.mode) == ("val_loss", "min")
    assert config.train.checkpoint.score_attribute == "val_loss"
    assert config.train.checkpoint.score_order == "min"
    assert config.mlflow.gate.metric == "test_perplexity"
    assert "model.dropout" not in config.sweep.search_space  # the default's MLP key is dropped


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"train": {"grad_accum_steps": 0}}, "train.grad_accum_steps"),
        ({"train": {"strategy": "deepspeed", "compile": True}}, "train.compile: false"),
        (
            {"sweep": {"search_space": {"model.dropout": {"uniform": [0.0, 0.2]}}}},
            "'model.dropout' is not a key of data.task=causal_lm",
        ),
        ({"model": {"kind": "mlp", "hf": None}}, "model.kind: hf"),
    ],
)
def test_bad_causal_lm_configs_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=None) as error:
        validate_config(_lm(**overrides))
    assert message in str(error.value)


def test_deepspeed_is_refused_before_anything_starts_on_cpus_or_without_its_extra(monkeypatch):
    import importlib.util

    from training.stages.preflight import check_strategy

    on_cpus = validate_config(_lm(train={"strategy": "deepspeed"}))  # the workers' check passes
    with pytest.raises(ConfigError, match=r"needs GPUs \(train.use_gpu: true\)") as error:
        check_strategy(on_cpus)
    assert "pip install -e '.[deepspeed]'" in str(error.value)
    gpus = on_cpus.with_overrides({"train.use_gpu": True, "train.resources_per_worker": {}})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"needs the DeepSpeed package: pip install"):
        check_strategy(gpus)
    monkeypatch.undo()
    check_strategy(gpus)  # installed (make test has the extra), GPUs asked for: no error
    check_strategy(validate_config(_lm()))  # ddp: nothing to check


def test_max_length_beyond_the_models_positions_is_refused_before_anything_starts():
    from training.stages.preflight import check_hf

    config = validate_config(_lm(data={"task": "causal_lm", "max_length": 64}))
    with pytest.raises(ConfigError, match=r"data.max_length=64 is more than the model's 32"):
        check_hf(config)


def test_inference_params_default_and_bad_values_are_named():
    from training.model.trainflow_pyfunc.generation import inference_params

    assert inference_params(None) == {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0}
    assert inference_params({"max_new_tokens": "5"})["max_new_tokens"] == 5
    with pytest.raises(ValueError, match="temperature"):
        inference_params({"temperature": -1.0})
    with pytest.raises(ValueError, match="max_new_tokens"):
        inference_params({"max_new_tokens": 0})


def test_a_prompt_drops_its_trailing_special_tokens_and_keeps_its_last_tokens():
    from training.data.text_spec import fit_wordpiece
    from training.model.trainflow_pyfunc.generation import end_id, prompt_ids

    tokenizer = fit_wordpiece(["the bank said profits rose", "the match ended"] * 20, 60)
    ids = prompt_ids(tokenizer, "the bank said", keep=100)
    assert tokenizer.id_to_token(ids[0]) == "[CLS]" and tokenizer.id_to_token(ids[-1]) == "said"
    assert prompt_ids(tokenizer, "the bank said", keep=2) == ids[-2:]
    assert end_id(tokenizer) == tokenizer.token_to_id("[SEP]")


def test_the_signature_takes_a_prompt_and_the_generation_params():
    from training.tracking.signature import signature

    sig = signature({"task": "causal_lm", "classes": []}, None)
    assert sig.inputs.input_names() == ["prompt"]
    assert sig.outputs.input_names() == ["generated_text"]
    assert {p.name: p.default for p in sig.params.params} == {
        "max_new_tokens": 32,
        "temperature": 0.0,
        "top_p": 1.0,
    }


def test_a_small_vocabulary_builds_without_gpt2s_token_ids_and_without_a_warning(monkeypatch):
    """GPT-2's default bos/eos (50256) past a 2,000-token vocabulary: None before the build,
    so transformers' config check has nothing to warn about on the user's console."""
    from transformers import configuration_utils

    from training.model.trainflow_pyfunc.causal_lm import lm_config

    warned = []  # warning_once: recorded here, whatever an earlier test already printed
    monkeypatch.setattr(configuration_utils.logger, "warning_once", warned.append)
    built = lm_config({"model_type": "gpt2", "vocab_size": 2000, "n_layer": 1}, pad_id=0)
    assert (built.bos_token_id, built.eos_token_id, built.pad_token_id) == (None, None, 0)
    assert [message for message in warned if "_token_id" in message] == []
    assert lm_config({"model_type": "gpt2", "n_layer": 1}, pad_id=0).eos_token_id == 50256


def test_the_drivers_check_resolves_a_small_vocabulary_without_a_warning(monkeypatch):
    """``trainflow run`` checks an hf model before its log file takes the libraries' output:
    the architecture it resolves has no bos/eos past the vocabulary for transformers to warn
    about on the console."""
    from transformers import configuration_utils

    from training.stages.preflight import check_hf

    warned = []
    monkeypatch.setattr(configuration_utils.logger, "warning_once", warned.append)
    check_hf(validate_config(_lm()))  # the driver's check of `trainflow run`
    assert [message for message in warned if "_token_id" in message] == []
