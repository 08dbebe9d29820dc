"""The Prefect event a run emits when it moves the champion alias: an automation on the Prefect
server reacts to it (``trainflow notify``, deployments/notifications.py). Emitted inside the flow
run, so Prefect relates it to the flow run, its flow and deployment."""

from __future__ import annotations

from typing import Any

from prefect.events import emit_event

from training.summary import ModelSummary

#: The event's name, and the prefix of its resource's id (``trainflow.model.<name>``).
CHAMPION_MOVED = "trainflow.champion.moved"
MODEL_RESOURCE = "trainflow.model"
#: The gate's decisions that move the champion to the new version.
MOVES = ("promoted", "first-model")


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
    emit_event(
        event=CHAMPION_MOVED,
        resource={
            "prefect.resource.id": f"{MODEL_RESOURCE}.{model.name}",
            "prefect.resource.name": model.name,
        },
        payload=payload,
    )
    return payload
