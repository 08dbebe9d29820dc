"""B11's model FLOPs utilisation (MFU): the FLOPs a causal LM's training needs per token, and the
peak FLOP/s of the device they are measured against.

FLOPs per token, the PaLM paper's formula (Chowdhury et al. 2022, appendix B) as nanoGPT's
``estimate_mfu`` applies it: ``6 N + 12 L d T``. ``N`` is the model's parameters less its
position embeddings (a lookup, no matmul; the token embedding stays in: GPT-2's output layer
shares it and is a real ``d x vocab`` matmul), ``6 N`` a forward (2 N) and backward (4 N) pass
over them, and ``12 L d T`` the attention scores and their weighted sum (``L`` layers, ``d``
width, ``T`` the sequence length). MFU = FLOPs per token x tokens/s ÷ peak FLOP/s.

The peak: on a GPU, the vendor's dense bf16 figure for the device's name (``GPU_PEAK_BF16``); on
CPUs, none is published for a shared virtual machine, so the peak is measured: the best fp32
``torch.mm`` FLOP/s on the same threads the run uses, under the same load (``matmul_peak``).
"""

from __future__ import annotations

import time
from typing import Any

#: Dense (no sparsity) bf16 tensor-core peaks, FLOP/s, by a substring of the device's name.
GPU_PEAK_BF16: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}
CPU_PEAK = "measured: best fp32 torch.mm FLOP/s on the run's threads, under the same load"


def flops_per_token(params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token: ``6 N + 12 L d T`` (``params`` = N, position embeddings out)."""
    if min(params, n_layer, n_embd, seq_len) < 1:
        raise ValueError("params, n_layer, n_embd and seq_len must be positive")
    return 6.0 * params + 12.0 * n_layer * n_embd * seq_len


def counted_params(model: Any) -> int:
    """N of a Hugging Face GPT-2-like model: its parameters less the position embeddings
    (``wpe``); shared tensors (tied input and output embeddings) counted once."""
    seen, total = set(), 0
    for name, param in model.named_parameters(remove_duplicate=True):
        if id(param) in seen or name.split(".")[-2:-1] == ["wpe"]:
            continue
        seen.add(id(param))
        total += param.numel()
    return total


def gpu_peak(device_name: str) -> float | None:
    """The dense bf16 peak of a known GPU (None for one the table does not know)."""
    for key, peak in GPU_PEAK_BF16.items():
        if key.lower() in device_name.lower():
            return peak
    return None


def matmul_peak(threads: int, size: int = 512, seconds: float = 1.0) -> float:
    """The best fp32 FLOP/s of ``size`` x ``size`` matmuls on ``threads`` torch threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)  # warm-up
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2.0 * size**3 / (time.perf_counter() - started))
        return best
    finally:
        torch.set_num_threads(previous)


def mfu(tokens_per_s: float, per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation, a fraction (None without a peak)."""
    if not peak or tokens_per_s <= 0:
        return None
    return tokens_per_s * per_token / peak


def model_flops(model: Any, size: dict[str, Any], gpu: bool, threads: int) -> dict[str, Any]:
    """B11's FLOPs per token of ``model`` (a GPT-2 of ``size``), and the peak MFU is measured
    against (a GPU's from the table, or the CPUs' measured on ``threads``)."""
    import torch

    params = counted_params(model)
    per_token = flops_per_token(
        params, size["gpt2"]["n_layer"], size["gpt2"]["n_embd"], size["seq_len"]
    )
    if gpu:
        device = torch.cuda.get_device_name(0)
        peak, basis = gpu_peak(device), f"{device}: dense bf16 peak (vendor's figure)"
        basis = basis if peak else f"{device}: not in the table of known peaks"
    else:
        peak, basis = matmul_peak(threads), CPU_PEAK + f" ({threads} thread{'s' * (threads > 1)})"
    return {
        "params_counted": params,
        "params_total": sum(p.numel() for p in model.parameters()),
        "flops_per_token": per_token,
        "peak_flops": peak,
        "peak_basis": basis,
        "formula": "6 N + 12 L d T (N: parameters less position embeddings)",
    }
