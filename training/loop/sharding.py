"""How the model is spread over the workers (``train.strategy``), and its full state dicts.

``ddp``: Ray Train's ``prepare_model`` (DistributedDataParallel), every rank a full replica.
``fsdp``: FullyShardedDataParallel, parameters, gradients and optimizer moments sharded across
ranks. On GPUs that is ``prepare_model(parallel_strategy="fsdp")``; Ray 2.60 refuses FSDP
without CUDA ("FSDP is only available with GPU-enabled training"), while torch's FSDP runs on
CPUs over gloo, so there we move the model with ``prepare_model(parallel_strategy=None)`` and
wrap it in the same class ourselves.

``deepspeed``: DeepSpeed's engine, ZeRO stage 2 or 3 (``training.loop.deepspeed_engine``).

Checkpoints always hold the FULL, unsharded state (``torch.distributed.checkpoint.state_dict``
with ``full_state_dict``): the same keys and shapes as a DDP run, so evaluation, the registered
model and a resume read them alike. Gathering is a collective: every rank calls these.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.loop import deepspeed_engine


def prepare(model: nn.Module, strategy: str) -> nn.Module:
    """The model placed on this worker's device and wrapped for ``strategy``."""
    import ray.train
    import ray.train.torch

    if strategy != "fsdp" or ray.train.get_context().get_world_size() == 1:
        return ray.train.torch.prepare_model(model)
    options = fsdp_options(model)
    if torch.cuda.is_available():
        return ray.train.torch.prepare_model(
            model, parallel_strategy="fsdp", parallel_strategy_kwargs=options
        )
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = ray.train.torch.prepare_model(model, parallel_strategy=None)
    return FullyShardedDataParallel(model, device_id=torch.device("cpu"), **options)


def layer_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of a Hugging Face model's transformer layers (its ``_no_split_modules``,
    e.g. ``BertLayer``): each becomes its own FSDP unit. Empty for trainflow's own networks."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return {type(m) for m in model.modules() if type(m).__name__ in names}


def fsdp_options(model: nn.Module) -> dict[str, Any]:
    """FSDP's keyword arguments for ``model``: one unit per transformer layer, and the original
    parameters kept (``use_orig_params``) where some are frozen (a LoRA adapter's base)."""
    options: dict[str, Any] = {}
    layers = layer_classes(model)
    if layers:
        import functools

        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        options["auto_wrap_policy"] = functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls=layers
        )
    if any(not p.requires_grad for p in model.parameters()):
        options["use_orig_params"] = True
    return options


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _full_options(model: nn.Module):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # On GPUs the gathered tensors go to rank 0's CPU memory only; torch's CPU offload frees
    # the unsharded storage it copies from when the parameters already live on the CPU.
    on_gpu = next(model.parameters()).device.type != "cpu"
    return StateDictOptions(full_state_dict=True, cpu_offload=on_gpu)


def model_state(model: nn.Module, rank: int) -> dict[str, Any] | None:
    """The full state dict (rank 0; None on other ranks): DDP's ``module.`` unwrapped, FSDP's
    shards gathered, DeepSpeed's ZeRO partitions consolidated."""
    if deepspeed_engine.is_engine(model):
        return deepspeed_engine.model_state(model, rank)
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(model, options=_full_options(model))
        return state if rank == 0 else None
    if rank != 0:
        return None
    return (model.module if hasattr(model, "module") else model).state_dict()


def optimizer_state(model: nn.Module, optimizer, rank: int) -> dict[str, Any] | None:
    """The optimizer's full state (rank 0; None on other ranks)."""
    if deepspeed_engine.is_engine(model):
        return deepspeed_engine.optimizer_state(optimizer, rank)
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = get_optimizer_state_dict(model, optimizer, options=_full_options(model))
        return state if rank == 0 else None
    return optimizer.state_dict() if rank == 0 else None


def load_optimizer_state(model: nn.Module, optimizer, state: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state; under FSDP and DeepSpeed each rank keeps its shard
    of it."""
    if deepspeed_engine.is_engine(model):
        deepspeed_engine.load_optimizer_state(optimizer, state)
        return
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, state, options=options)
        return
    optimizer.load_state_dict(state)
