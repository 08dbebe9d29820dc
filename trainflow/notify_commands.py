"""``trainflow notify``: a webhook told when a pipeline run fails and when a run moves the
champion, set up on the running stack's Prefect server (deployments/notifications.py)."""

from __future__ import annotations

import os

import typer

from trainflow.output import console
from training.errors import ConfigError


def notify(
    webhook: str | None = typer.Option(
        None,
        "--webhook",
        help="URL that receives a JSON POST when a pipeline run fails or moves the champion. "
        "Kept in a Prefect block on the server; never printed.",
    ),
    secret_from_env: str | None = typer.Option(
        None,
        "--secret-from-env",
        help="Name of an environment variable holding a secret, sent as "
        "'Authorization: Bearer <secret>'; kept in the Prefect block only.",
    ),
    off: bool = typer.Option(False, "--off", help="Remove the automations and the block."),
) -> None:
    """Messages when it matters: Prefect automations send a webhook on a failed pipeline run
    and on a run that moves the champion (docs/notifications.md)."""
    from deployments import notifications
    from deployments.deploy import require_api_url
    from trainflow.env import check_prefect_api, prepare_environment

    if off == (webhook is not None):
        raise ConfigError("give --webhook URL to set notifications up, or --off to remove them")
    prepare_environment()
    check_prefect_api()
    api_url = require_api_url()
    if off:
        removed = notifications.remove(api_url)
        console.print("notifications removed" if removed else "no notifications were set up")
        return
    secret = None
    if secret_from_env is not None:
        secret = os.environ.get(secret_from_env)
        if not secret:
            raise ConfigError(f"--secret-from-env {secret_from_env}: that variable is not set")
    if not webhook.startswith(("http://", "https://")):
        raise ConfigError("--webhook must be an http:// or https:// URL")
    done = notifications.configure(api_url, webhook, secret)
    console.print(
        f"notifications to {done.destination} (block {done.block!r}"
        f"{', with a secret' if secret else ''}):",
        highlight=False,
    )
    for name in done.automations:
        console.print(f"  automation {name!r}", highlight=False)
