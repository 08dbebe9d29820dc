"""``train.strategy: deepspeed``: the model and the loop's optimizer handed to DeepSpeed's engine,
ZeRO stage 2 (gradients and optimizer state partitioned) or 3 (parameters too).

The loop keeps its own step, so every strategy trains the same model from the same batches:
- each micro-batch's loss (already divided by the batch's targets) goes through
  ``engine.backward``, and one ``engine.step()`` ends the batch:
  ``managed_gradient_accumulation: false`` makes the caller's ``step()`` the accumulation
  boundary, however many micro-batches a batch has (a short last batch has fewer);
- the optimizer is the loop's AdamW, which the ZeRO optimizer wraps; its parameter groups stay
  the same dicts, so the loop's LambdaLR keeps setting the LR DeepSpeed steps with;
- weights stay fp32 and ``train.precision: bf16`` is the loop's autocast, as with DDP and FSDP;
  no gradient clipping (DeepSpeed's engine would clip to its own default otherwise).

Checkpoints hold the same full state as DDP's: the consolidated model (ZeRO-3 gathers it layer by
layer) and AdamW's moments per parameter name, gathered from the partitions (as FSDP's full
optimizer state is keyed). Every function here that gathers is a collective: all ranks call it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: Steps between DeepSpeed's own progress lines: never (the loop reports its own).
_NO_PROGRESS_LINES = 2**31 - 1


def engine_config(train: Any, micro_rows: int, world_size: int) -> dict[str, Any]:
    """DeepSpeed's config for the loop's steps (``train``: the TrainConfig)."""
    return {
        # DeepSpeed checks micro x accumulation x world = batch; the loop owns the batch
        # (managed_gradient_accumulation: false), so these only describe one micro-step.
        "train_micro_batch_size_per_gpu": micro_rows,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_rows * world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": train.deepspeed.stage},
        # The loop's AdamW (torch's), not one of DeepSpeed's fused optimizers.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": _NO_PROGRESS_LINES,
    }


def initialize(
    model: nn.Module, optimizer: torch.optim.Optimizer, train: Any, micro_rows: int, world_size: int
) -> tuple[nn.Module, EngineOptimizer]:
    """(the engine, an optimizer whose ``step`` is the engine's) for this worker. Ray Train has
    set up torch.distributed already; DeepSpeed joins that process group and broadcasts rank 0's
    weights."""
    import deepspeed

    without_inference_all_reduce(deepspeed)
    names = _parameter_names(model, optimizer)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=engine_config(train, micro_rows, world_size)
    )
    return engine, EngineOptimizer(engine, optimizer, names)


def without_inference_all_reduce(deepspeed) -> None:
    """DeepSpeed's communication backend builds its shared-memory all-reduce kernel on CPUs
    the first time a machine runs it (JIT: g++ and ninja, ~50 s and ~90 CPU-seconds on 2
    cores), and only its inference all-reduce uses it: training reduces through the
    torch.distributed group Ray Train set up. Marked unavailable, it is never built."""
    compatible = deepspeed.ops.__compatible_ops__
    deepspeed.ops.__compatible_ops__ = {**compatible, "deepspeed_shm_comm": False}


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The optimizer's parameters by name, group by group, before ZeRO re-points its groups at
    flat partitions."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [[name_of[id(p)] for p in group["params"]] for group in optimizer.param_groups]


def is_engine(model: nn.Module) -> bool:
    import sys

    deepspeed = sys.modules.get("deepspeed")  # never imported here for a model that is not one
    return deepspeed is not None and isinstance(model, deepspeed.DeepSpeedEngine)


class EngineOptimizer:
    """The loop's view of the optimizer under DeepSpeed: its LR groups are AdamW's, a step is
    the engine's (the reduction of the accumulated gradients, then AdamW on the partitions)."""

    def __init__(self, engine: Any, client: torch.optim.Optimizer, names: list[list[str]]):
        self.engine, self.client, self.names = engine, client, names

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.client.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()

    def step(self) -> None:
        self.engine.step()


def model_state(engine: Any, rank: int) -> dict[str, Any] | None:
    """The full fp32 state dict on rank 0 (None elsewhere); ZeRO-3 gathers the partitions."""
    if engine.zero_optimization_partition_weights():
        state = engine._zero3_consolidated_16bit_state_dict()  # the weights' own dtype: fp32
    else:
        state = engine.module.state_dict() if rank == 0 else None
    if rank != 0:
        return None
    return {key: value.detach().cpu().clone() for key, value in state.items()}


def optimizer_state(optimizer: EngineOptimizer, rank: int) -> dict[str, Any] | None:
    """AdamW's full state keyed by parameter name (rank 0; None elsewhere)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    parameters = dict(optimizer.engine.module.named_parameters())
    step = _step_count(optimizer)
    state, groups = {}, []
    for group, names in zip(optimizer.param_groups, optimizer.names, strict=True):
        for name in names:
            moments = {
                key: safe_get_full_optimizer_state(parameters[name], key)
                for key in ("exp_avg", "exp_avg_sq")
            }
            state[name] = {"step": torch.tensor(float(step)), **moments}
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": names})
    if rank != 0:
        return None
    for entry in state.values():
        entry.update({k: v.detach().cpu() for k, v in entry.items() if k != "step"})
    return {"state": state, "param_groups": groups}


def load_optimizer_state(optimizer: EngineOptimizer, saved: dict[str, Any]) -> None:
    """A checkpoint's AdamW state back into this rank's partitions (every rank calls it)."""
    from deepspeed.utils import safe_set_full_optimizer_state

    _create_states(optimizer)
    parameters = dict(optimizer.engine.module.named_parameters())
    for name, entry in saved["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            safe_set_full_optimizer_state(parameters[name], entry[key], key)
    steps = {float(entry["step"]) for entry in saved["state"].values()}
    _set_step_count(optimizer, steps.pop() if steps else 0.0)


def _partition_states(optimizer: EngineOptimizer) -> list[dict[str, Any]]:
    # The ZeRO optimizer's inner AdamW steps one flat partition per group: its state is there.
    return list(optimizer.engine.optimizer.optimizer.state.values())


def _create_states(optimizer: EngineOptimizer) -> None:
    """AdamW's state of each flat partition, zero, as its first step would create it.

    A resume loads the moments before any step; ZeRO only links its partitions to AdamW's
    state after the first one."""
    zero = optimizer.engine.optimizer
    adamw = zero.optimizer
    # ZeRO-3 points AdamW's groups at its flat partitions only while it steps them.
    flats = getattr(zero, "fp32_partitioned_groups_flat", None) or [
        flat for group in adamw.param_groups for flat in group["params"]
    ]
    for flat in flats:
        if "exp_avg" not in adamw.state.get(flat, {}):
            adamw.state[flat] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(flat),
                "exp_avg_sq": torch.zeros_like(flat),
            }
    link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-2 only
    if link is not None:
        link()


def _step_count(optimizer: EngineOptimizer) -> float:
    """AdamW's step (the same for every partition; 0 before the first)."""
    return max((float(s["step"]) for s in _partition_states(optimizer) if "step" in s), default=0)


def _set_step_count(optimizer: EngineOptimizer, step: float) -> None:
    for state in _partition_states(optimizer):
        state["step"] = torch.tensor(step)
