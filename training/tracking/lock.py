"""The promotion lock: one promotion of a registered model at a time, on any MLflow store."""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from typing import TYPE_CHECKING

from training.errors import TrainflowError

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

# The lock is a registered model that exists while held.
LOCK_SUFFIX = ".champion-lock"
LOCK_OWNER_TAG = "trainflow.lock_owner"
LOCK_TIMEOUT_S = 60.0
LOCK_STALE_S = 300.0  # far longer than a promotion takes (~1 s)


@contextlib.contextmanager
def registry_lock(client: MlflowClient, name: str, timeout_s: float = LOCK_TIMEOUT_S):
    """A mutex over the MLflow store, so it works alike on sqlite and an ``mlflow server``:
    creating a registered model is atomic (the store's unique name), so the process that
    creates ``<name>.champion-lock`` holds the lock and deletes it when done. A lock left by
    a crashed process is broken once older than ``LOCK_STALE_S``."""
    from mlflow.exceptions import MlflowException

    lock = f"{name}{LOCK_SUFFIX}"
    owner = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.create_registered_model(
                lock,
                tags={LOCK_OWNER_TAG: owner},
                description=f"trainflow: held while the champion alias of {name} moves",
            )
            break
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        _break_if_stale(client, lock)
        if time.monotonic() > deadline:
            raise TrainflowError(
                f"could not take the promotion lock {lock!r} in {timeout_s:.0f} s: another "
                f"run is promoting a model of {name}; retry, or delete the registered model "
                f"{lock!r} if no run is promoting"
            )
        time.sleep(0.1 + random.random() * 0.2)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            held = client.get_registered_model(lock)
            if held.tags.get(LOCK_OWNER_TAG) == owner:
                client.delete_registered_model(lock)


def _break_if_stale(client: MlflowClient, lock: str) -> None:
    """Delete the lock if its holder has had it far longer than a promotion takes."""
    from mlflow.exceptions import MlflowException

    try:
        held = client.get_registered_model(lock)
    except MlflowException:
        return  # released meanwhile
    age_s = time.time() - (held.creation_timestamp or 0) / 1000
    if age_s > LOCK_STALE_S:
        log.warning("breaking the promotion lock %s left %.0f s ago", lock, age_s)
        with contextlib.suppress(MlflowException):
            client.delete_registered_model(lock)
