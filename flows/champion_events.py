"""The Prefect event emitted when the champion alias moves: an automation on the Prefect server
reacts to it (``trainflow notify``, deployments/notifications.py). A run that promotes emits it
inside its flow run, so Prefect relates it to the flow run, its flow and deployment;
``trainflow rollback`` emits it from the command, with no flow run."""

from __future__ import annotations

import os
from typing import Any

from prefect.events import emit_event

from training.summary import ModelSummary

#: The event's name, and the prefix of its resource's id (``trainflow.model.<name>``).
CHAMPION_MOVED = "trainflow.champion.moved"
MODEL_RESOURCE = "trainflow.model"
#: The gate's decisions that move the champion to the new version.
MOVES = ("promoted", "first-model")
#: The decision a rollback's event names.
ROLLBACK = "rollback"
# Seconds a command waits for its event to reach the server before it exits.
FLUSH_TIMEOUT_S = 30.0


def champion_moved(model: ModelSummary, metric: str, run_id: str) -> dict[str, Any] | None:
    """Emit ``trainflow.champion.moved`` when the run's version took the champion alias;
    returns the event's payload (None: the champion did not move)."""
    if model.decision not in MOVES or model.champion_version != model.version:
        return None
    record = model.gate_record or {}
    payload = {
        "model": model.name,
        "version": str(model.version),
        "previous": record.get("champion_version"),
        "decision": model.decision,
        "metric": metric,
        "value": model.challenger_value,
        "reason": record.get("reason") or model.decision,
        "run_id": run_id,
    }
    _emit(model.name, payload)
    return payload


def champion_rolled_back(
    model: str, move: dict[str, Any], metric: str | None, value: Any
) -> dict[str, Any] | None:
    """Emit ``trainflow.champion.moved`` for a rollback (``move``: champion_history's record)
    and wait until it reached the server; returns the payload. Only with a Prefect server to
    tell (PREFECT_API_URL: the stack's, or the user's): without one no automation could react,
    and Prefect would start a temporary server only to drop the event (None)."""
    if not os.environ.get("PREFECT_API_URL"):
        return None
    from prefect.events.worker import EventsWorker

    payload = {
        "model": model,
        "version": str(move["to"]),
        "previous": move.get("from"),
        "decision": ROLLBACK,
        "metric": metric,
        "value": value,
        "reason": move.get("why"),
        "by": move.get("by"),
    }
    _emit(model, payload)
    # The events go out on a background thread; the command exits right after.
    EventsWorker.drain_all(timeout=FLUSH_TIMEOUT_S)
    return payload


def _emit(model: str, payload: dict[str, Any]) -> None:
    emit_event(
        event=CHAMPION_MOVED,
        resource={
            "prefect.resource.id": f"{MODEL_RESOURCE}.{model}",
            "prefect.resource.name": model,
        },
        payload=payload,
    )
