"""``model.kind: hf``: its config, the network (padding masked and cut), LoRA (only the adapter
and head train; the registered model is merged), FSDP's per-layer units, the warmup, and the
errors a user gets before anything starts (one message each)."""

from __future__ import annotations

import pytest
import torch
from hf_fixtures import TINY_BERT, fitted_tokens, hf_model_config, text_spec

from training.config import ModelConfig, validate_config
from training.errors import ConfigError
from training.model.hf_model import (
    build_hf_training_network,
    checkpoint_model_config,
    servable_state,
)
from training.model.trainflow_pyfunc.networks import build_network
from training.model.trainflow_pyfunc.tokens import PAD


@pytest.fixture(scope="module")
def tokens() -> dict:
    return fitted_tokens(max_length=16)


def _hf(**hf) -> dict:
    return {"model": {"kind": "hf", "hf": hf}}


def test_a_model_from_a_config_needs_a_tokenizer_and_exactly_one_source():
    with pytest.raises(ConfigError, match="tokenizer"):
        validate_config(_hf(config=TINY_BERT))
    with pytest.raises(ConfigError, match="exactly one of model.hf.name_or_path"):
        validate_config(_hf(config=TINY_BERT, name_or_path="x", tokenizer="train"))
    with pytest.raises(ConfigError, match="model.hf goes with model.kind=hf"):
        validate_config({"model": {"kind": "hf"}})
    raw = {**_hf(config=TINY_BERT, tokenizer="train"), "data": {"columns": {"t": "text"}}}
    config = validate_config(raw)
    assert config.model.hf.config["model_type"] == "bert" and config.data.max_length == 128


def test_lora_rank_warmup_and_weight_decay_are_sweepable():
    raw = _hf(config=TINY_BERT, tokenizer="train", lora={"r": 4})
    raw["sweep"] = {
        "search_space": {
            "model.hf.lora.r": {"choice": [2, 8]},
            "train.warmup_ratio": {"uniform": [0.0, 0.5]},
            "train.weight_decay": {"loguniform": [1e-5, 1e-2]},
            "train.lr": {"loguniform": [1e-4, 1e-2]},
        }
    }
    config = validate_config(raw)
    assert config.with_overrides({"model.hf.lora.r": 2}).model.hf.lora.r == 2
    raw["sweep"]["search_space"]["model.hf.lora.r"] = {"choice": [0]}
    with pytest.raises(ConfigError, match="lora.r"):
        validate_config(raw)


def test_padding_is_masked_and_cut_a_row_scores_alike_alone_or_beside_a_longer_one(tokens):
    torch.manual_seed(0)
    network = build_network(hf_model_config(), [16], 3, "classification", None, tokens).eval()
    short = torch.tensor([[2.0, 40, 41, 3]])
    beside = torch.tensor([[2.0, 40, 41, 3, PAD, PAD, PAD], [2, 50, 51, 52, 53, 54, 3]])
    with torch.no_grad():
        alone, both = network(short), network(beside)
    assert both.shape == (2, 3)
    assert torch.allclose(alone[0], both[0], atol=1e-5)
    with torch.no_grad():  # columns of padding only are cut: the same logits as without them
        assert torch.allclose(network(torch.cat([short, torch.full((1, 9), PAD)], 1)), alone)


def test_a_regression_has_one_output(tokens):
    network = build_network(hf_model_config(), [16], 1, "regression", None, tokens)
    assert network(torch.tensor([[2.0, 40, 3]])).shape == (1, 1)
    assert network.model.config.problem_type == "regression"


def test_lora_trains_the_adapter_and_head_only_and_registers_merged(tokens):
    torch.manual_seed(0)
    model_config = hf_model_config(lora={"r": 4, "alpha": 8.0, "dropout": 0.0})
    network = build_hf_training_network(model_config, 3, "classification", tokens)
    trainable = [n for n, p in network.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)
    assert sum(p.numel() for p in network.parameters() if p.requires_grad) < 0.2 * sum(
        p.numel() for p in network.parameters()
    )
    with torch.no_grad():  # a trained adapter: B is zero at init, so move it
        for name, p in network.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    spec = text_spec(tokens)
    state = {
        "model": network.state_dict(),
        "spec": spec,
        "model_config": checkpoint_model_config(ModelConfig(**model_config), network),
    }
    merged = servable_state(state)
    assert merged["model_config"]["hf"]["lora"] is None
    assert not [k for k in merged["model"] if "lora" in k]
    plain = build_network(merged["model_config"], [16], 3, "classification", None, tokens)
    plain.load_state_dict(merged["model"])
    ids = torch.tensor([[2.0, 40, 41, 42, 3], [2, 50, 3, PAD, PAD]])
    with torch.no_grad():
        assert torch.allclose(plain.eval()(ids), network.eval()(ids), atol=1e-5)
        assert not torch.allclose(
            plain(ids),
            build_network(hf_model_config(), [16], 3, "classification", None, tokens).eval()(ids),
            atol=1e-3,
        )


def test_a_pretrained_directory_loads_by_path_and_its_checkpoint_config_stands_alone(
    tokens, tmp_path
):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    AutoModelForSequenceClassification.from_config(
        AutoConfig.for_model(**TINY_BERT)
    ).save_pretrained(tmp_path / "tiny")
    hf = {"name_or_path": str(tmp_path / "tiny"), "tokenizer": "train"}
    model = ModelConfig(kind="hf", hf=hf)
    network = build_hf_training_network(model.model_dump(), 3, "classification", tokens)
    recorded = checkpoint_model_config(model, network)
    assert recorded["hf"]["name_or_path"] is None and recorded["hf"]["config"]["hidden_size"] == 32
    again = build_network(recorded, [16], 3, "classification", None, tokens)
    again.load_state_dict(network.state_dict())


def test_fsdp_wraps_each_transformer_layer_and_keeps_frozen_params(tokens):
    from training.loop.sharding import fsdp_options, layer_classes

    network = build_hf_training_network(hf_model_config(lora={"r": 2}), 3, "classification", tokens)
    names = {c.__name__ for c in layer_classes(network)}
    assert "BertLayer" in names and "BertModel" not in names  # the model's _no_split_modules
    options = fsdp_options(network)
    assert options["use_orig_params"] is True and "auto_wrap_policy" in options
    mlp = build_network({"kind": "mlp", "hidden_sizes": [4], "dropout": 0.0}, [3], 2)
    assert fsdp_options(mlp) == {}


def test_warmup_ramps_the_lr_over_its_share_of_the_steps_then_the_cosine_rules():
    import math

    from training.config import TrainConfig
    from training.loop.schedule import optimizer_and_schedule, total_steps, warmup_steps

    train = TrainConfig(lr=0.1, batch_size=10, warmup_ratio=0.25)
    steps = total_steps(train, max_epochs=4, train_rows=95)
    assert warmup_steps(train, steps) == 10  # 0.25 x 4 epochs x 10 steps
    assert warmup_steps(train.model_copy(update={"warmup_ratio": 0.0}), steps) == 0
    optimizer, scheduler = optimizer_and_schedule(torch.nn.Linear(2, 2), train, 4, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[4] == pytest.approx(0.05)  # step 5 of the 10-step ramp
    assert lrs[10] == pytest.approx(0.1)  # past the ramp: the cosine, from the full LR
    assert lrs[12] == pytest.approx(0.05 * (1 + math.cos(math.pi * 2 / 30)))


def _config(tmp_path, **hf):
    return validate_config({**_hf(**hf), "data": {"source": str(tmp_path), "max_length": 64}})


def test_a_hub_id_that_cannot_be_fetched_offline_says_it_needs_the_network(tmp_path):
    from training.stages.preflight import check_hf

    config = _config(tmp_path, name_or_path="no-such-org/no-such-model-xyz")
    with pytest.raises(ConfigError, match="needs the network .* or give a local directory"):
        check_hf(config)


def test_max_length_beyond_the_position_embeddings_is_refused(tmp_path):
    from training.stages.preflight import check_hf

    config = _config(tmp_path, config=TINY_BERT, tokenizer="train")
    config.data.max_length = 65
    with pytest.raises(ConfigError, match="data.max_length=65 is more than the model's 64"):
        check_hf(config)


def test_a_tokenizer_with_more_tokens_than_the_model_is_refused(tmp_path):
    from hf_fixtures import bbc_texts
    from transformers import PreTrainedTokenizerFast

    from training.data.text_spec import fit_wordpiece
    from training.stages.preflight import check_hf

    fitted = fit_wordpiece([t for t, _ in bbc_texts()], 280)
    PreTrainedTokenizerFast(tokenizer_object=fitted, pad_token="[PAD]").save_pretrained(
        tmp_path / "tok"
    )
    small = {**TINY_BERT, "vocab_size": 100}
    config = _config(tmp_path, config=small, tokenizer=str(tmp_path / "tok"))
    with pytest.raises(ConfigError, match=r"the tokenizer has \d+ tokens but the model's vocab"):
        check_hf(config)
    check_hf(_config(tmp_path, config=TINY_BERT, tokenizer=str(tmp_path / "tok")))


def test_a_model_directory_without_a_tokenizer_says_how_to_get_one(tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from training.stages.preflight import check_hf

    model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(**TINY_BERT))
    model.save_pretrained(tmp_path / "bare")
    config = _config(tmp_path, name_or_path=str(tmp_path / "bare"))
    with pytest.raises(ConfigError, match="set model.hf.tokenizer: train to fit one"):
        check_hf(config)
    check_hf(_config(tmp_path, name_or_path=str(tmp_path / "bare"), tokenizer="train"))
