"""The notification setup's parts without a server: the messages' templates render to JSON with
what the receiver checks, the automations are valid Prefect automations on the right events,
the block keeps the secret out of its plain fields, and only the webhook's host is printed."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from deployments import notifications
from flows.champion_events import CHAMPION_MOVED, champion_moved
from training.summary import ModelSummary


def _render(template: str, **context) -> str:
    from prefect.server.utilities.user_templates import render_user_template_sync

    return render_user_template_sync(template, context)


RUN = {
    "flow": SimpleNamespace(name="pipeline"),
    "flow_run": SimpleNamespace(
        name="clever-fox",
        id="1234",
        state=SimpleNamespace(name="Failed", message='Flow run failed: "data.source" <missing>'),
    ),
}


def test_the_failed_message_is_json_naming_flow_run_and_state():
    body = json.loads(_render(notifications.FAILED_BODY, **RUN))
    assert body == {
        "event": "flow-run-failed",
        "flow": "pipeline",
        "flow_run": "clever-fox",
        "flow_run_id": "1234",
        "state": "Failed",
        "message": 'Flow run failed: "data.source" <missing>',
    }
    assert (
        _render(notifications.FAILED_SUBJECT, **RUN) == "trainflow: pipeline run clever-fox Failed"
    )


def test_the_champion_message_carries_the_model_version_and_reason():
    payload = {
        "model": "digits",
        "version": "3",
        "previous": "2",
        "decision": "promoted",
        "metric": "test_accuracy",
        "value": 0.975,
        "reason": "the interval's lower bound +0.01 > min_delta 0",
    }
    running = {
        **RUN,
        "flow_run": SimpleNamespace(
            name="r", id="9", state=SimpleNamespace(name="Running", message=None)
        ),
    }
    body = json.loads(
        _render(notifications.CHAMPION_BODY, event=SimpleNamespace(payload=payload), **running)
    )
    assert body["event"] == "champion-moved" and body["state"] == "Running"
    assert {k: body[k] for k in payload} == payload
    subject = _render(notifications.CHAMPION_SUBJECT, event=SimpleNamespace(payload=payload))
    assert subject == "trainflow: digits champion is now version 3"


def test_the_automations_react_to_failures_of_the_pipeline_and_to_champion_moves():
    block = uuid.uuid4()
    failed, moved = notifications.automations(block)
    assert failed.trigger.expect == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}
    assert failed.trigger.match_related.model_dump() == {
        "prefect.resource.role": "flow",
        "prefect.resource.name": "pipeline",
    }
    assert moved.trigger.expect == {CHAMPION_MOVED}
    for automation in (failed, moved):
        (action,) = automation.actions
        assert action.type == "send-notification" and action.block_document_id == block


def test_the_secret_is_a_secret_field_and_only_the_host_is_printed():
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    url = "https://hooks.example.com:8443/services/T0/B0/XXXX?token=abc"
    assert notifications.destination(url) == "https://hooks.example.com:8443"
    block = CustomWebhookNotificationBlock(
        name="t",
        url=url,
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
        headers={"Authorization": "Bearer {{token}}"},
        secrets={"token": "s3cret-canary"},
    )
    assert "s3cret-canary" not in repr(block) and "s3cret-canary" not in block.model_dump_json()
    sent = block._build_request_args("the body", "the subject")
    assert sent["headers"] == {"Authorization": "Bearer s3cret-canary"}
    assert sent["json"] == {"subject": "the subject", "body": "the body"}


def _model(decision: str, version: str = "3", champion: str | None = "3") -> ModelSummary:
    return ModelSummary(
        name="digits",
        version=version,
        model_uri="models:/digits/3",
        logged_model_uri="models:/m-1",
        source_run_id="r",
        state_file="artifacts/state.pt",
        decision=decision,
        champion_version=champion,
        challenger_version=version,
        challenger_value=0.97,
        champion_value=0.95,
        gate_record={"champion_version": "2", "reason": "won"},
    )


@pytest.mark.parametrize(
    ("model", "emitted"),
    [
        (_model("promoted"), True),
        (_model("first-model"), True),
        (_model("kept-champion", champion="2"), False),
    ],
)
def test_only_a_move_of_the_champion_emits_the_event(monkeypatch, model, emitted):
    sent = []
    monkeypatch.setattr(
        "flows.champion_events.emit_event", lambda **event: sent.append(event) or event
    )
    payload = champion_moved(model, "test_accuracy", "run1")
    assert bool(sent) is emitted and (payload is not None) is emitted
    if emitted:
        (event,) = sent
        assert event["event"] == CHAMPION_MOVED
        assert event["resource"]["prefect.resource.id"] == "trainflow.model.digits"
        assert event["payload"]["version"] == "3" and event["payload"]["previous"] == "2"


def test_a_rollback_message_has_no_flow_run_and_says_who_rolled_back():
    """`trainflow rollback` emits the event outside any flow run: Prefect's template context
    then has no flow or flow run object, and the body must still be JSON."""
    payload = {
        "model": "digits",
        "version": "2",
        "previous": "3",
        "decision": "rollback",
        "metric": "test_accuracy",
        "value": 0.95,
        "reason": "version 3 misroutes refunds",
        "by": "alice",
    }
    body = json.loads(
        _render(notifications.CHAMPION_BODY, event=SimpleNamespace(payload=payload), flow=None)
    )
    assert body["event"] == "champion-moved"
    assert body["flow"] is None and body["flow_run"] is None
    assert body["flow_run_id"] is None and body["state"] is None
    assert {k: body[k] for k in payload} == payload
    subject = _render(notifications.CHAMPION_SUBJECT, event=SimpleNamespace(payload=payload))
    assert subject == "trainflow: digits champion is now version 2"


def test_a_rollback_emits_the_event_only_with_a_prefect_server_to_tell(monkeypatch):
    from prefect.events.worker import EventsWorker

    from flows.champion_events import ROLLBACK, champion_rolled_back

    sent, drained = [], []
    monkeypatch.setattr("flows.champion_events.emit_event", lambda **event: sent.append(event))
    monkeypatch.setattr(EventsWorker, "drain_all", lambda **kw: drained.append(kw))
    move = {"from": "3", "to": "2", "why": "bad refunds", "by": "alice", "when": "t"}
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert champion_rolled_back("digits", move, "test_accuracy", 0.95) is None
    assert sent == [] and drained == []

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    payload = champion_rolled_back("digits", move, "test_accuracy", 0.95)
    (event,) = sent
    assert event["event"] == CHAMPION_MOVED
    assert event["resource"]["prefect.resource.id"] == "trainflow.model.digits"
    assert payload == event["payload"]
    assert payload["decision"] == ROLLBACK and payload["version"] == "2"
    assert payload["previous"] == "3" and payload["by"] == "alice"
    assert payload["reason"] == "bad refunds" and payload["value"] == 0.95
    assert len(drained) == 1  # flushed before the command exits
