"""A causal LM sharded and merged: an FSDP run of a tiny GPT-2 on 2 CPU workers wraps
each ``GPT2Block`` as its own unit (the model's ``_no_split_modules``) and checkpoints a full
state that loads into a plain ``AutoModelForCausalLM`` with ``weights_only=True`` and gives
the pyfunc's logits; and a LoRA language model merged as registration merges it gives the
adapter's logits and generates the same tokens at temperature 0. One preprocessing of 60 BBC
News articles and one training, shared by the module."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import ray.cloudpickle as cloudpickle
import torch
from tiny_lm import TINY_GPT2, bbc_manifest, lm_config

from training.loop.trainer import train_final
from training.model.trainflow_pyfunc.model import TrainflowModel
from training.model.trainflow_pyfunc.tokens import PAD

pytestmark = pytest.mark.integration

# The recording worker travels to Ray workers by value (they cannot import the tests).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def lm_manifest(ray_local, layout, tmp_path_factory):
    return bbc_manifest(layout, tmp_path_factory.mktemp("lm-data"))


def _recording_worker(settings, record: str):
    """The real worker, with the FSDP units of rank 0's prepared model written to ``record``."""
    import ray.train
    from torch.distributed.fsdp import FullyShardedDataParallel

    from training.loop import sharding
    from training.loop.loop import train_worker

    original = sharding.prepare

    def prepare(model, strategy):
        prepared = original(model, strategy)
        units = [
            type(m.module).__name__
            for m in prepared.modules()
            if isinstance(m, FullyShardedDataParallel)
        ]
        if ray.train.get_context().get_world_rank() == 0:
            Path(record).write_text(json.dumps(units))
        return prepared

    sharding.prepare = prepare
    try:
        return train_worker(settings)
    finally:
        sharding.prepare = original


@pytest.fixture(scope="module")
def fsdp_lm(lm_manifest, layout, tmp_path_factory):
    manifest, source = lm_manifest
    record = tmp_path_factory.mktemp("fsdp-units") / "units.json"
    config = lm_config(source, "train.strategy=fsdp")
    worker = functools.partial(_recording_worker, record=str(record))
    outcome = train_final(config, manifest, "lm-fsdp", layout, train_fn=worker)
    return outcome, json.loads(record.read_text())


def test_fsdp_wraps_each_gpt2_block_as_its_own_unit(fsdp_lm):
    outcome, units = fsdp_lm
    assert outcome.history[0]["workers"] == 2.0
    # the root unit (the whole network) and one per decoder layer, by _no_split_modules
    assert units.count("GPT2Block") == TINY_GPT2["n_layer"], units
    assert len(units) == TINY_GPT2["n_layer"] + 1, units


def _full_rows(manifest, rows: int = 4) -> torch.Tensor:
    from training.data.read import load_split_arrays

    ids, _, _ = load_split_arrays(manifest, "val")
    full = torch.from_numpy(ids[(ids != PAD).all(axis=1)][:rows])
    assert len(full) == rows, "packed blocks: most rows are full"
    return full


def test_an_fsdp_lm_checkpoint_loads_into_a_plain_causal_lm_with_the_pyfuncs_logits(
    fsdp_lm, lm_manifest
):
    from transformers import AutoConfig, AutoModelForCausalLM

    outcome, _ = fsdp_lm
    manifest, _ = lm_manifest
    state = torch.load(Path(outcome.checkpoint_path) / "state.pt", weights_only=True)
    architecture = dict(state["model_config"]["hf"]["config"])
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**architecture))
    weights = {k.removeprefix("model."): v for k, v in state["model"].items()}
    plain.load_state_dict(weights)  # strict: full tensors, no FSDP prefixes or flat shards
    pyfunc = TrainflowModel()
    pyfunc.load_state(state)
    ids = _full_rows(manifest)
    with torch.no_grad():
        theirs = plain.eval()(input_ids=ids.long()).logits
        ours = pyfunc.network(ids)
        fresh = AutoModelForCausalLM.from_config(AutoConfig.for_model(**architecture))
        untrained = fresh.eval()(input_ids=ids.long()).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(theirs, untrained, atol=1e-3)  # the trained weights, loaded


def _lora_network(spec: dict):
    from training.config import ModelConfig
    from training.model.hf_model import build_hf_training_network

    lora = {"r": 4, "alpha": 8.0, "dropout": 0.0}
    model = ModelConfig(kind="hf", hf={"config": TINY_GPT2, "tokenizer": "train", "lora": lora})
    network = build_hf_training_network(
        model.model_dump(mode="json"), 1, "causal_lm", spec["tokens"]
    )
    return model, network


def _one_step(network, ids: torch.Tensor) -> None:
    """One AdamW step of the causal LM loss: the adapter's B matrices leave zero."""
    from training.model.trainflow_pyfunc.causal_lm import NextTokenLoss, target_count

    optimizer = torch.optim.AdamW([p for p in network.parameters() if p.requires_grad], lr=0.05)
    network.train()
    (NextTokenLoss()(network(ids), ids) / target_count(ids)).backward()
    optimizer.step()
    network.eval()


def test_a_lora_lm_merged_as_registered_gives_its_logits_and_greedy_tokens(lm_manifest, tmp_path):
    from training.model.hf_model import checkpoint_model_config
    from training.model.trainflow_pyfunc.generation import generate_texts
    from training.tracking.servable import servable_state_file

    manifest, _ = lm_manifest
    spec, ids = manifest.spec.to_dict(), _full_rows(manifest)
    torch.manual_seed(0)
    model, network = _lora_network(spec)
    _one_step(network, ids)
    lora_b = [p for n, p in network.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)
    state = {
        "model": network.state_dict(),
        "optimizer": {},
        "spec": spec,
        "model_config": checkpoint_model_config(model, network),
    }
    torch.save(state, tmp_path / "state.pt")
    # what registration does: the state rewritten merged, without PEFT or the optimizer
    path, model_config = servable_state_file(str(tmp_path / "state.pt"), str(tmp_path))
    assert model_config["hf"]["lora"] is None
    pyfunc = TrainflowModel()
    pyfunc.load_state(torch.load(path, weights_only=True))
    assert not [k for k in pyfunc.network.state_dict() if "lora" in k]
    with torch.no_grad():
        adapted = network(ids)
        torch.testing.assert_close(pyfunc.network(ids), adapted, rtol=1e-4, atol=1e-5)
        with network.model.disable_adapter():  # the adapter matters: without it, other logits
            assert not torch.allclose(network(ids), adapted, atol=1e-3)
    prompts = ["the bank said profits", "the match ended", "shares in the firm"]
    greedy = {"max_new_tokens": 8, "temperature": 0.0}
    served = pyfunc.predict(None, pd.DataFrame({"prompt": prompts}), params=greedy)
    peft = generate_texts(network, spec["tokens"], prompts, greedy, "cpu")
    assert served["generated_text"].tolist() == peft
    assert any(text.strip() for text in peft)
