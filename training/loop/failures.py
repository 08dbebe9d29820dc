"""Turning a fit that Ray Train gave up on into our errors: each names the cause and the fix."""

from __future__ import annotations

import errno
import sys

from training.config import PipelineConfig
from training.errors import (
    FunctionContractError,
    StorageError,
    TrainflowError,
    WorkerFailedError,
    one_line,
)

# errno values that mean "the storage is full" (EFBIG: a file-size limit such as RLIMIT_FSIZE).
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _causes(error: BaseException):
    """The error, what it wraps (cause/context), and each worker's or the controller's failure."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend((getattr(current, "worker_failures", None) or {}).values())
        pending += [getattr(current, "controller_failure", None)]
        pending += [getattr(current, "cause", None)]  # what a RayTaskError wraps
        pending += [current.__cause__, current.__context__]


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in _DISK_FULL:
        return True
    return any(text in str(error) for text in ("No space left on device", "File too large"))


def _short_reason(error: BaseException) -> str:
    """Each failed rank and the first sentence of why (Ray's messages run to many lines)."""
    failures = getattr(error, "worker_failures", None) or {}
    if not failures:
        return _first_sentence(error, 200)
    return "; ".join(
        f"rank {rank}: {_first_sentence(e, 150)}" for rank, e in sorted(failures.items())
    )


def _first_sentence(error: BaseException, limit: int) -> str:
    """The first sentence of the error's last line (Ray puts the worker's own message last)."""
    sentence = one_line(error, limit=sys.maxsize, last=True).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[:limit] + "…"


def contract_error(error: BaseException | None) -> FunctionContractError | None:
    """A user function's broken contract among the causes of ``error`` (the innermost: Ray's
    wrappers of it are instances too, with their own traceback in the message), or None."""
    if error is None:
        return None
    found = [cause for cause in _causes(error) if isinstance(cause, FunctionContractError)]
    return FunctionContractError(one_line(found[-1], limit=sys.maxsize)) if found else None


def training_error(error: BaseException, config: PipelineConfig, storage: str) -> BaseException:
    """One clear error for a fit that Ray Train gave up on: ours (divergence, bad data) as
    raised in the worker, a full disk named as such, else the worker failure and the fix."""
    causes = list(_causes(error))
    for cause in causes:
        if isinstance(cause, TrainflowError):
            return cause
    restarts = f"train.max_failures={config.train.max_failures}"
    for cause in causes:
        if _is_disk_full(cause):
            return StorageError(
                f"disk full: a checkpoint could not be written under {storage} ({restarts}); "
                "free space there or set storage.root to a larger disk, then re-run with the "
                "same run id to resume from the last complete checkpoint"
            )
    reason = _short_reason(error)
    return WorkerFailedError(
        f"training failed and Ray Train gave up after {restarts} restart(s): {reason}; see the "
        "worker logs, raise train.max_failures to tolerate more, or re-run with the same run "
        "id to resume from the last checkpoint"
    )
