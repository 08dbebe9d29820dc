"""A Hugging Face sequence-classification model as a trainflow network (``model.kind: hf``):
padded token ids in (``tokens.PAD`` where a row has ended), logits ``[batch, outputs]`` out.

Built from plain data, a config dict (``AutoConfig.for_model(**config)``), so a checkpoint or the
registered model holds only a state dict, that dict and the tokenizer's JSON: it loads with
``torch.load(weights_only=True)`` and needs no download. Pretrained weights and LoRA adapters
are training's business (``training.model.hf_model``); what is registered is a plain model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .tokens import PAD

#: Keys of a config's dict that describe where it came from or its old head, not the network.
_NOT_ARCHITECTURE = (
    "architectures",
    "id2label",
    "label2id",
    "num_labels",
    "problem_type",
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
)


def plain_config(config) -> dict[str, Any]:
    """A transformers config as the plain dict :func:`hf_config` rebuilds it from."""
    raw = config.to_dict()
    return {k: v for k, v in raw.items() if k not in _NOT_ARCHITECTURE}


def hf_config(config: Mapping[str, Any], num_outputs: int, task: str, pad_id: int):
    """The transformers config of a plain dict, with trainflow's head: one output per class, or
    one number for a regression."""
    from transformers import AutoConfig

    raw = {k: v for k, v in dict(config).items() if k not in _NOT_ARCHITECTURE}
    built = AutoConfig.for_model(**raw)
    built.num_labels = int(num_outputs)
    built.problem_type = "regression" if task == "regression" else "single_label_classification"
    built.pad_token_id = int(pad_id)  # e.g. GPT-2 finds each row's last token by it
    return built


class HFClassifier(nn.Module):
    """The wrapped model, fed trainflow's batches: ids padded with PAD (any float or int dtype:
    ids below 2**24 are exact in float32, the dtype every trainflow batch shares)."""

    def __init__(self, model: nn.Module, pad_id: int):
        super().__init__()
        self.model = model
        self.pad_id = int(pad_id)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        mask = ids != PAD
        # Columns past the batch's longest row are padding only: cut them.
        width = max(1, int(mask.sum(dim=1).max())) if len(ids) else 1
        ids, mask = ids[:, :width], mask[:, :width]
        ids = ids.masked_fill(~mask, self.pad_id)
        return self.model(input_ids=ids, attention_mask=mask.long()).logits


def build_hf_network(
    model_config: Mapping[str, Any], num_outputs: int, task: str, tokens: Mapping[str, Any]
) -> HFClassifier:
    """The network of a registered or checkpointed model: randomly initialised from
    ``model.hf.config`` (its weights come from the state dict)."""
    from transformers import AutoModelForSequenceClassification

    hf = model_config["hf"]
    if hf.get("config") is None or hf.get("lora"):
        raise ValueError(
            "this state holds a pretrained or LoRA model config; rebuild it with "
            "training.model.hf_model (the registered model holds a plain config)"
        )
    config = hf_config(hf["config"], num_outputs, task, int(tokens["pad_id"]))
    model = AutoModelForSequenceClassification.from_config(config)
    return HFClassifier(model, int(tokens["pad_id"]))
