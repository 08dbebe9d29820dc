"""A Hugging Face model in training (``model.kind: hf``): pretrained weights loaded on each
worker from ``model.hf.name_or_path`` (a directory, or a hub id through Hugging Face's own
client), or a random init from ``model.hf.config``; a LoRA adapter (PEFT) when ``model.hf.lora``
is set, so that only the adapter and the head train.

A checkpoint's ``model_config`` is self-contained (:func:`checkpoint_model_config`): the
resolved architecture as a plain dict, so nothing is downloaded after training. The registered
model is the MERGED model (:func:`servable_state`): LoRA's low-rank updates are added into the
base weights, and serving needs neither PEFT nor the base model's files.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from training.config import ModelConfig
from training.model.trainflow_pyfunc.causal_lm import CAUSAL_LM, HFCausalLM, lm_config
from training.model.trainflow_pyfunc.hf import HFClassifier, hf_config, plain_config


def _base_model(name_or_path: str, num_outputs: int, task: str, pad_id: int) -> nn.Module:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    own = plain_config(AutoConfig.from_pretrained(name_or_path))
    config = hf_config(own, num_outputs, task, pad_id)
    # A pretrained head of another size (or none) is replaced by a new one: said, not refused.
    return AutoModelForSequenceClassification.from_pretrained(
        name_or_path, config=config, ignore_mismatched_sizes=True
    )


def with_lora(model: nn.Module, lora: Mapping[str, Any], task: str = "") -> nn.Module:
    """``model`` with a LoRA adapter: its own weights frozen, the adapter and head trainable."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.CAUSAL_LM if task == CAUSAL_LM else TaskType.SEQ_CLS,
        r=int(lora["r"]),
        lora_alpha=float(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=list(lora["target_modules"]) if lora.get("target_modules") else None,
    )
    return get_peft_model(model, config)


def build_hf_training_network(
    model_config: Mapping[str, Any], num_outputs: int, task: str, tokens: Mapping[str, Any]
) -> HFClassifier | HFCausalLM:
    """The network a worker trains (a checkpoint's self-contained config builds the same)."""
    from transformers import AutoModelForSequenceClassification

    hf, pad_id = model_config["hf"], int(tokens["pad_id"])
    if task == CAUSAL_LM:
        return _causal_lm(hf, pad_id)
    if hf.get("name_or_path"):
        model = _base_model(hf["name_or_path"], num_outputs, task, pad_id)
    else:
        config = hf_config(hf["config"], num_outputs, task, pad_id)
        model = AutoModelForSequenceClassification.from_config(config)
    if hf.get("lora"):
        model = with_lora(model, hf["lora"])
    return HFClassifier(model, pad_id)


def _causal_lm(hf: Mapping[str, Any], pad_id: int) -> HFCausalLM:
    """A language model to train: pretrained (a directory or hub id) or from a config."""
    from transformers import AutoModelForCausalLM

    if hf.get("name_or_path"):
        model = AutoModelForCausalLM.from_pretrained(hf["name_or_path"])
        model.config.pad_token_id = pad_id
    else:
        model = AutoModelForCausalLM.from_config(lm_config(hf["config"], pad_id))
    if hf.get("lora"):
        model = with_lora(model, hf["lora"], CAUSAL_LM)
    return HFCausalLM(model, pad_id)


def enable_gradient_checkpointing(network: nn.Module) -> None:
    """train.gradient_checkpointing: the Hugging Face model recomputes its layers' activations
    in backward instead of keeping them (less memory, one more forward per step)."""
    model = getattr(network, "model", None)
    if model is None or not hasattr(model, "gradient_checkpointing_enable"):
        raise ValueError("train.gradient_checkpointing needs model.kind=hf")
    # Non-reentrant: works with frozen inputs (LoRA) and under DDP.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _architecture(network: nn.Module) -> Any:
    """The transformers config of a network (under DDP, FSDP or PEFT wrappers)."""
    inner = getattr(network, "module", network)
    model = inner.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.config


def checkpoint_model_config(model: ModelConfig, network: nn.Module) -> dict[str, Any]:
    """``model`` as plain data, an hf model's source replaced by its resolved architecture."""
    raw = model.model_dump(mode="json")
    if model.kind != "hf":
        return raw
    hf = raw["hf"]
    hf["tokenizer"] = hf["tokenizer"] or hf["name_or_path"]
    hf["config"], hf["name_or_path"] = plain_config(_architecture(network)), None
    return raw


def servable_state(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's state as the registered model holds it: a LoRA model merged into plain
    weights (on a copy), its config without the adapter. Other states are returned as they are."""
    model_config = state["model_config"]
    hf = model_config.get("hf") or {}
    if model_config.get("kind") != "hf" or not hf.get("lora"):
        return state
    spec = state["spec"]
    outputs = 1 if spec.get("task") == "regression" else len(spec["classes"])
    network = build_hf_training_network(model_config, outputs, spec.get("task"), spec["tokens"])
    network.load_state_dict(state["model"])
    merged = type(network)(network.model.merge_and_unload(), network.pad_id)
    plain = copy.deepcopy(model_config)
    plain["hf"]["lora"] = None
    return {**state, "model": merged.state_dict(), "model_config": plain}
