"""``train.compile``: the training steps run through ``torch.compile``, or eagerly where it fails.

The model is compiled after DDP/FSDP wrapping (PyTorch's advice: DDP's optimizer then splits the
graph at its gradient buckets). Only the training steps call the compiled module; validation and
checkpoints use the wrapped model itself, so a state dict never holds ``_orig_mod.`` keys.

``torch.compile`` is lazy: a backend that cannot compile (no C compiler for Inductor on a CPU, an
unsupported operator or platform) fails at the first step, in the forward or in the backward.
That step is then run again eagerly, and every later one too, after one line on the console.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

from training.errors import one_line

Result = TypeVar("Result")

# torch.compile's default; a unit test swaps in a backend that raises.
BACKEND = "inductor"


class CompiledSteps:
    """The module the training steps call: the compiled one until a step fails with it."""

    def __init__(self, model: nn.Module, rank: int = 0) -> None:
        import torch

        self.eager = model
        self.rank = rank
        self.compiled: nn.Module | None = None
        try:
            self.compiled = torch.compile(model, backend=BACKEND)
        except Exception as exc:  # noqa: BLE001 - any refusal means: train eagerly
            self._fall_back(exc)

    @property
    def active(self) -> bool:
        """Whether steps still run compiled."""
        return self.compiled is not None

    def run(self, step: Callable[[nn.Module], Result], reset: Callable[[], None]) -> Result:
        """``step(module)`` with the compiled module; if it raises, ``reset()`` (drop what the
        failed step accumulated) and ``step`` the eager one, now and from then on."""
        if self.compiled is None:
            return step(self.eager)
        try:
            return step(self.compiled)
        except Exception as exc:  # noqa: BLE001 - a real error raises again, eagerly
            self._fall_back(exc)
            reset()
            return step(self.eager)

    def _fall_back(self, exc: BaseException) -> None:
        self.compiled = None
        if self.rank == 0:  # one line for the run, not one per worker, and no traceback
            exc = root_cause(exc)
            reason = one_line(exc, limit=200)
            print(
                f"trainflow: warning: train.compile: torch.compile failed "
                f"({type(exc).__name__}: {reason}); training eagerly"
            )


def training_steps(model: nn.Module, enabled: bool, rank: int) -> CompiledSteps | None:
    """What runs the training steps: compiled steps with ``train.compile``, else None (the
    model itself)."""
    return CompiledSteps(model, rank) if enabled else None


def root_cause(exc: BaseException) -> BaseException:
    """The error under Dynamo's wrappers (``BackendCompilerFailed``: "backend='inductor'
    raised:", then the one that says why)."""
    seen = {id(exc)}
    while True:
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner
