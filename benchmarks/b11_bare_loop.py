"""B11's bare loop: a causal LM trained as a Hugging Face user writes it, on the same blocks of
token ids trainflow's preprocessing made (``tokens.PAD`` where a block ends early), each epoch's
training phase timed; and the steady tokens/s both kinds of arm are measured by."""

from __future__ import annotations

import time
from typing import Any


def steady_tokens_per_s(tokens: list[int], seconds: list[float], scale: int = 1) -> float:
    """Tokens/s over the epochs after the first (``scale``: ranks that each trained as many)."""
    if len(tokens) < 2 or len(tokens) != len(seconds):
        raise RuntimeError("steady state needs at least 2 timed epochs (the first is warm-up)")
    return scale * sum(tokens[1:]) / sum(seconds[1:])


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bare_arm(size: dict[str, Any], train_ids, pad_id: int, threads: int, gpu: bool):
    def run(rep: int) -> dict[str, Any]:
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return bare_loop(size, train_ids, pad_id, "cuda" if gpu else "cpu")
        finally:
            torch.set_num_threads(previous)

    return run


def bare_model(size: dict[str, Any], pad_id: int):
    """The bare loop's GPT-2: ``AutoModelForCausalLM`` from the size's config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    # No bos/eos: GPT-2's 50256 lies past a small vocabulary, and training reads neither.
    ends = {"bos_token_id": None, "eos_token_id": None}
    config = AutoConfig.for_model("gpt2", **size["gpt2"], pad_token_id=pad_id, **ends)
    return AutoModelForCausalLM.from_config(config)


def bare_loop(size: dict[str, Any], train_ids, pad_id: int, device: str) -> dict[str, Any]:
    import torch

    from training.model.trainflow_pyfunc.tokens import PAD

    torch.manual_seed(0)
    model = bare_model(size, pad_id).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    bf16, batch = size["precision"] == "bf16", size["batch"]
    tokens, seconds = [], []
    for epoch in range(size["epochs"]):
        order = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(epoch))
        count, began = 0, time.perf_counter()
        for start in range(0, len(order), batch):
            ids = train_ids[order[start : start + batch]].to(device)
            mask = ids != PAD
            width = int(mask.sum(dim=1).max())
            ids, mask = ids[:, :width].long(), mask[:, :width]
            count += int(mask.sum())
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                out = model(
                    input_ids=ids.masked_fill(~mask, pad_id),
                    attention_mask=mask.long(),
                    labels=ids.masked_fill(~mask, -100),
                )
            out.loss.backward()
            optimizer.step()
            out.loss.item()
        sync()
        tokens.append(count)
        seconds.append(time.perf_counter() - began)
    return {
        "tokens_per_s": steady_tokens_per_s(tokens, seconds),
        "train_s": seconds,
        "tokens": tokens,
    }
