"""A Hugging Face causal language model as a trainflow network (``data.task: causal_lm``):
padded token ids in (``tokens.PAD`` where a row has ended; a prompt's ids stored as
``prompts.no_loss``, ``-2 - id``, where the loss does not predict them), next-token logits
``[batch, positions, vocab]`` out. Built from plain data as the classifier is (``hf.py``): a
config dict, a state dict, the tokenizer's JSON; loads without a download or trainflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .hf import HFClassifier
from .tokens import PAD

CAUSAL_LM = "causal_lm"


def lm_config(config: Mapping[str, Any], pad_id: int):
    """The transformers config of a plain dict (``hf.plain_config``), padding with ``pad_id``."""
    from transformers import AutoConfig

    from .hf import _NOT_ARCHITECTURE

    raw = {k: v for k, v in dict(config).items() if k not in _NOT_ARCHITECTURE}
    built = AutoConfig.for_model(**{**raw, **ids_past_the_vocabulary(raw)})
    built.pad_token_id = int(pad_id)
    return built


def ids_past_the_vocabulary(raw: Mapping[str, Any]) -> dict[str, None]:
    """bos/eos ids (given, or the architecture's defaults, e.g. GPT-2's 50256) that a smaller
    vocabulary does not have: None, passed to the build (a config built with them warns)."""
    from transformers import CONFIG_MAPPING

    vocab = raw.get("vocab_size")
    kind = raw.get("model_type")
    # (not .get: the lazy mapping's get() answers None for a known kind)
    defaults = CONFIG_MAPPING[kind] if kind in CONFIG_MAPPING else None  # noqa: SIM401
    past = {}
    for key in ("bos_token_id", "eos_token_id"):
        value = raw.get(key, getattr(defaults, key, None))
        if isinstance(value, int) and isinstance(vocab, int) and value >= vocab:
            past[key] = None
    return past


class HFCausalLM(HFClassifier):
    """The wrapped language model, fed trainflow's batches as the classifier is (ids padded
    with PAD, any dtype); its logits are the next-token ones of every position."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(token_values(ids))


def token_values(ids: torch.Tensor) -> torch.Tensor:
    """The ids as the model reads them: a no-loss id (``-2 - id``) back to ``id``; PAD kept."""
    ids = ids.long()
    return torch.where(ids < PAD, -2 - ids, ids)


def build_causal_lm_network(model_config: Mapping[str, Any], tokens: Mapping[str, Any]):
    """The network of a registered or checkpointed language model (weights from its state)."""
    from transformers import AutoModelForCausalLM

    hf = model_config["hf"]
    if hf.get("config") is None or hf.get("lora"):
        raise ValueError(
            "this state holds a pretrained or LoRA model config; rebuild it with "
            "training.model.hf_model (the registered model holds a plain config)"
        )
    pad_id = int(tokens["pad_id"])
    return HFCausalLM(AutoModelForCausalLM.from_config(lm_config(hf["config"], pad_id)), pad_id)


class NextTokenLoss(nn.Module):
    """The causal LM loss: cross-entropy of each position's logits against the next token,
    summed over the targets (PAD positions, a prompt's ids and each row's last token have
    none): transformers' ``labels=`` loss with -100 over padding and prompts."""

    def forward(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        targets = next_tokens(ids, logits.shape[1])
        return nn.functional.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"
        )


def next_tokens(ids: torch.Tensor, width: int) -> torch.Tensor:
    """Each position's target: the next id (-100 where there is none, or where the next id is
    PAD or a prompt's), ``width`` columns."""
    ids = ids[:, :width].long()
    targets = torch.full_like(ids, -100)
    following = ids[:, 1:]
    targets[:, :-1] = following.masked_fill(following < 0, -100)
    return targets


def target_count(ids: torch.Tensor) -> int:
    """Next-token targets in a batch of padded ids: each row's tokens but its first, and but
    a prompt's (no-loss) ids."""
    return int((ids[:, 1:] >= 0).sum())
