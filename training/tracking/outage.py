"""A tracking server's blip: telling it from other failures, and waiting for the server to
answer again within ``mlflow.outage_grace_s`` (``training.stages.blips`` wraps each stage).

MLflow's client retries a failed request twice (``store.HTTP_ENV_DEFAULTS``), which covers a
hiccup of seconds, not a server restart. During training, epoch rows wait for the server on
their own (``training.loop.progress``); any other call that fails because the server does not
answer ends up here: the stage says it is waiting on one console line, polls the server's
health, and raises a retriable error once it answers again (the stage's work is idempotent:
a finished fit is restored from its checkpoint, the registry keys versions by source run).
Past the grace the run stops with exit 1, naming the server and the fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from training import progress
from training.errors import (
    ServiceUnreachableError,
    TrackingUnavailableError,
    TrainflowError,
)
from training.platform.secrets import redact

# What MLflow's client (urllib3 / requests underneath) says when the server is not there.
_NOT_ANSWERING = (
    "Max retries exceeded",
    "Connection refused",
    "Failed to establish a new connection",
    "RemoteDisconnected",
    "Connection aborted",
    "Read timed out",
    "too many 502 error responses",
    "too many 503 error responses",
    "too many 504 error responses",
)
_POLL_S = 2.0
_SAY_EVERY_S = 10.0


def is_server_gone(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the server did not answer at all."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, TrainflowError) and not isinstance(exc, ServiceUnreachableError):
            return False  # ours, with its own message and retry rule
        if isinstance(exc, ConnectionError) or any(m in str(exc) for m in _NOT_ANSWERING):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def wait_until_answering(
    uri: str,
    grace_s: float,
    stage: str,
    check: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Poll the server's health until it answers; the seconds waited. Raises
    TrackingUnavailableError once ``grace_s`` has passed without an answer."""
    from training.tracking.store import check_reachable

    check = check or check_reachable
    started, said = clock(), None
    shown = redact(uri)
    while True:
        try:
            check(uri)
            waited = clock() - started
            if waited:
                progress.report(stage, f"MLflow at {shown} answers again after {waited:.0f} s")
            return waited
        except ServiceUnreachableError:
            waited = clock() - started
        if waited >= grace_s:
            raise TrackingUnavailableError(
                f"MLflow at {shown} has not answered for {waited:.0f} s (mlflow.outage_grace_s "
                f"= {grace_s:g}); start it again, then resume the run "
                f"(`{TrackingUnavailableError.RESUME_ANY}`: nothing trained is trained again)"
            ) from None
        if said is None or clock() - said >= _SAY_EVERY_S:
            said = clock()
            progress.report(
                stage, f"MLflow at {shown} not answering; waiting ({waited:.0f} s of {grace_s:g} s)"
            )
        sleep(_POLL_S)
