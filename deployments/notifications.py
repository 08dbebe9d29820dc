"""Messages when it matters, through Prefect's own machinery: a webhook notification block
(``CustomWebhookNotificationBlock``; the URL and any secret live in the block, on the Prefect
server, never in trainflow's config, a flow's parameters or a log) and two automations that send
through it: one on a pipeline flow run that fails or crashes, one on the
``trainflow.champion.moved`` event a run emits when it moves the champion, and
``trainflow rollback`` when it moves it back (flows/champion_events.py). The server's triggers
and actions services deliver them.

Each message is a JSON POST ``{"subject": ..., "body": ...}`` whose body is itself JSON: the
flow, the flow run, its state and, for a champion move, the model, its new and previous version
and the gate's reason (docs/notifications.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit
from uuid import UUID

from deployments.prefect_api import prefect_client
from flows.champion_events import CHAMPION_MOVED, MODEL_RESOURCE

BLOCK_NAME = "trainflow-webhook"
FLOW_NAME = "pipeline"
FAILED_AUTOMATION = "trainflow: a pipeline run failed"
CHAMPION_AUTOMATION = "trainflow: the champion moved"
AUTOMATIONS = (FAILED_AUTOMATION, CHAMPION_AUTOMATION)
#: The block's secret value's key: sent as ``Authorization: Bearer <secret>``.
SECRET_KEY = "token"

_RUN = (
    '"flow": {{ flow.name | tojson }}, "flow_run": {{ flow_run.name | tojson }}, '
    '"flow_run_id": "{{ flow_run.id }}", "state": {{ flow_run.state.name | tojson }}'
)
FAILED_SUBJECT = "trainflow: {{ flow.name }} run {{ flow_run.name }} {{ flow_run.state.name }}"
FAILED_BODY = (
    '{"event": "flow-run-failed", ' + _RUN + ', "message": {{ flow_run.state.message | tojson }}}'
)
CHAMPION_SUBJECT = (
    "trainflow: {{ event.payload.model }} champion is now version {{ event.payload.version }}"
)
# A rollback's event comes from `trainflow rollback`, not a flow run: its run fields are null.
_RUN_OR_NULL = (
    '"flow": {{ flow.name | default(none) | tojson }}, '
    '"flow_run": {{ flow_run.name | default(none) | tojson }}, '
    '"flow_run_id": {% if flow_run.id %}"{{ flow_run.id }}"{% else %}null{% endif %}, '
    '"state": {{ flow_run.state.name | default(none) | tojson }}'
)
CHAMPION_KEYS = ("model", "version", "previous", "decision", "metric", "value", "reason", "by")
CHAMPION_BODY = (
    '{"event": "champion-moved", '
    + _RUN_OR_NULL
    + ", "
    + ", ".join(
        f'"{key}": {{{{ event.payload.{key} | default(none) | tojson }}}}' for key in CHAMPION_KEYS
    )
    + "}"
)


@dataclass(frozen=True)
class Configured:
    """What ``trainflow notify`` set up: the block and the automations' ids by name."""

    block: str
    destination: str  # the webhook's scheme and host: never its path or query (secrets there)
    automations: dict[str, str]


def destination(url: str) -> str:
    """``https://hooks.example.com`` of a webhook URL: what may be printed of it."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


@contextlib.contextmanager
def _api(api_url: str) -> Iterator[None]:
    """Prefect's block and automation classes use the profile's client: bind it to ``api_url``."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        yield


def save_block(api_url: str, url: str, secret: str | None) -> UUID:
    """The webhook block, created or replaced; returns its block document id."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name="trainflow",
        url=url,
        method="POST",
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
        headers={"Authorization": f"Bearer {{{{{SECRET_KEY}}}}}"} if secret else None,
        secrets={SECRET_KEY: secret} if secret else {},
    )
    with _api(api_url):
        return block.save(BLOCK_NAME, overwrite=True)


def automations(block_id: UUID) -> list:
    """The two automations, sending through the block ``block_id``."""
    from prefect.automations import Automation, EventTrigger, SendNotification

    failed = EventTrigger(
        expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
        match={"prefect.resource.id": "prefect.flow-run.*"},
        match_related={"prefect.resource.role": "flow", "prefect.resource.name": FLOW_NAME},
        posture="Reactive",
        threshold=1,
    )
    moved = EventTrigger(
        expect={CHAMPION_MOVED},
        match={"prefect.resource.id": f"{MODEL_RESOURCE}.*"},
        posture="Reactive",
        threshold=1,
    )
    return [
        Automation(
            name=FAILED_AUTOMATION,
            description="a run of the pipeline flow failed or crashed: send the webhook",
            trigger=failed,
            actions=[
                SendNotification(
                    block_document_id=block_id, subject=FAILED_SUBJECT, body=FAILED_BODY
                )
            ],
        ),
        Automation(
            name=CHAMPION_AUTOMATION,
            description="a pipeline run or a rollback moved the champion alias: send the webhook",
            trigger=moved,
            actions=[
                SendNotification(
                    block_document_id=block_id, subject=CHAMPION_SUBJECT, body=CHAMPION_BODY
                )
            ],
        ),
    ]


def _remove_automations(client) -> None:
    for name in AUTOMATIONS:
        for found in client.read_automations_by_name(name):
            client.delete_automation(found.id)


def configure(api_url: str, url: str, secret: str | None) -> Configured:
    """Save the block and (re)create both automations, idempotently."""
    from prefect.events.schemas.automations import AutomationCore

    block_id = save_block(api_url, url, secret)
    created = {}
    with prefect_client(api_url) as client:
        _remove_automations(client)
        for automation in automations(block_id):
            core = AutomationCore(**automation.model_dump(exclude={"id"}))
            created[automation.name] = str(client.create_automation(core))
    return Configured(BLOCK_NAME, destination(url), created)


def remove(api_url: str) -> bool:
    """Delete the automations and the block; False when there was nothing to delete."""
    from prefect.exceptions import ObjectNotFound

    found = False
    with prefect_client(api_url) as client:
        for name in AUTOMATIONS:
            for automation in client.read_automations_by_name(name):
                client.delete_automation(automation.id)
                found = True
        try:
            block = client.read_block_document_by_name(BLOCK_NAME, "custom-webhook")
        except ObjectNotFound:
            return found
        client.delete_block_document(block.id)
    return True
