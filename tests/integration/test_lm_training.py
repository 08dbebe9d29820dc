"""A causal LM's training step, on a tiny GPT-2 without Ray: gradient accumulation of
k micro-batches equals one step on the whole batch (the loss is per next-token target, rows of
different lengths included), through the loop's own accumulate_gradients and loss; and
gradient checkpointing changes memory, not gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from training.loop.loop import accumulate_gradients
from training.model.hf_model import enable_gradient_checkpointing
from training.model.trainflow_pyfunc.causal_lm import HFCausalLM, NextTokenLoss, target_count
from training.model.trainflow_pyfunc.tokens import PAD

TINY_GPT2 = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 16, "n_layer": 2, "n_head": 2}
TINY_GPT2.update(n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _network() -> HFCausalLM:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return HFCausalLM(AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_GPT2)), 0)


def _batch(rows: int = 8, width: int = 16) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (rows, width), generator=generator).float()
    for row in range(rows):  # rows of different lengths, padded as the collate pads them
        ids[row, width - row :] = PAD
    return ids


def _step(network, ids, micro: int) -> tuple[float, dict[str, torch.Tensor]]:
    network.zero_grad(set_to_none=True)
    loss = accumulate_gradients(network, NextTokenLoss(), ids, ids, micro, False, target_count(ids))
    return loss, {n: p.grad.clone() for n, p in network.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_accumulated_micro_batches_equal_one_large_batch_step(micro):
    base, ids = _network(), _batch()
    loss_whole, whole = _step(base, ids, micro=len(ids))
    loss_split, split = _step(copy.deepcopy(base), ids, micro=micro)
    assert loss_split == pytest.approx(loss_whole, rel=1e-5)
    assert whole.keys() == split.keys() and whole
    for name, grad in whole.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # And the optimizer's step after it is the same step.
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    for model, grads in zip(models, (whole, split), strict=True):
        for name, param in model.named_parameters():
            param.grad = grads[name]
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    for (name, a), (_, b) in zip(*(m.named_parameters() for m in models), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_the_mean_loss_is_per_target_not_per_row():
    network, ids = _network(), _batch()
    loss_sum, _ = _step(network, ids, micro=3)
    theirs = network.model(
        input_ids=ids.long().clamp(min=0), attention_mask=(ids != PAD).long(), labels=_labels(ids)
    ).loss
    assert loss_sum / target_count(ids) == pytest.approx(theirs.item(), rel=1e-4)


def _labels(ids: torch.Tensor) -> torch.Tensor:
    labels = ids.long().clone()
    labels[ids == PAD] = -100
    return labels


def test_gradient_checkpointing_gives_the_same_gradients():
    plain, ids = _network(), _batch()
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed)
    checkpointed.train()
    plain.train()
    assert checkpointed.model.is_gradient_checkpointing
    _, expected = _step(plain, ids, micro=4)
    _, got = _step(checkpointed, ids, micro=4)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
