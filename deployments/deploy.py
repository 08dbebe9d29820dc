"""The scheduled deployments of the pipeline flow (`trainflow deploy`).

Each deployment runs ``flows/pipeline.py:pipeline`` (or, ``score``, ``flows/score.py:score``,
a flow of the same name) from this checkout on the stack's process work pool. Its parameter
``config`` is the validated configuration of a YAML file in configs/, so the Prefect UI shows
the schema as a form and a run's parameters are a whole config.
Deploying again updates the deployments in place (same names, same schedule slugs).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from training.errors import ConfigError, ServiceUnreachableError, TrainflowError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/pipeline.py:pipeline"
SCORE_ENTRYPOINT = "flows/score.py:score"
FLOW_NAME = "pipeline"
# A fixed anchor keeps an interval schedule identical across re-deploys (Prefect's default
# anchor is "now", which would make every deploy a schedule change).
INTERVAL_ANCHOR = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
# Scheduling right after a deploy: the client's retries after the first try (it backs off 2, 4,
# 8 s, and sleeps 16 s more before giving up: 4 tries in 30 s), and seconds per try.
SCHEDULE_RETRIES = 3
SCHEDULE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    config_file: str
    description: str
    cron: str | None = None
    interval: datetime.timedelta | None = None
    timezone: str = "UTC"
    paused: bool = False
    tags: tuple[str, ...] = ()
    # Runs of this deployment at once; a run that finds the slot taken waits in Prefect's
    # AwaitingConcurrencySlot state (ENQUEUE) instead of overlapping the running one.
    concurrency_limit: int = 1
    entrypoint: str = ENTRYPOINT


DEPLOYMENTS = (
    DeploymentSpec(
        name="nightly",
        config_file="configs/default.yaml",
        description="The full pipeline every night: sweep, train, evaluate, promote.",
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        tags=("scheduled",),
    ),
    DeploymentSpec(
        name="smoke",
        config_file="configs/smoke.yaml",
        description="The whole pipeline on the smoke config (a few minutes); paused by default, "
        "run it by hand or resume its schedule.",
        interval=datetime.timedelta(hours=6),
        timezone="UTC",
        paused=True,
        tags=("smoke",),
    ),
    DeploymentSpec(
        name="score",
        config_file="configs/default.yaml",
        description="The champion scores a table (parameter `source`, default the config's "
        "data.source; local or s3://) through Ray Data and the registered pyfunc; predictions "
        "beside it with the model version. Paused by default: set `source`, then resume.",
        cron="0 6 * * *",
        timezone="UTC",
        paused=True,
        tags=("score",),
        entrypoint=SCORE_ENTRYPOINT,
    ),
)


def spec(name: str) -> DeploymentSpec:
    for item in DEPLOYMENTS:
        if item.name == name:
            return item
    known = ", ".join(d.name for d in DEPLOYMENTS)
    raise ConfigError(f"no deployment named {name!r}; the deployments are: {known}")


def spec_parameters(item: DeploymentSpec, overrides: list[str] | None = None) -> dict[str, Any]:
    """The deployment's parameters: its YAML file (with ``KEY=VALUE`` overrides) validated
    against the config schema."""
    from training.config.overrides import load_config

    config = load_config(REPO_ROOT / item.config_file, list(overrides or []))
    return {"config": config.model_dump(mode="json")}


def with_schedule(
    item: DeploymentSpec, cron: str | None = None, interval_s: float | None = None
) -> DeploymentSpec:
    """``item`` on the user's cron or interval (seconds) instead of its own; paused as before."""
    if cron is not None and interval_s is not None:
        raise ConfigError("give a deployment either --cron or --interval, not both")
    if cron is not None:
        from prefect.schedules import Cron

        try:
            Cron(cron)  # validated here: the server would refuse it less clearly
        except ValueError as exc:
            raise ConfigError(f"--cron {cron!r} is not a cron expression: {exc}") from None
        return replace(item, cron=cron, interval=None)
    if interval_s is not None:
        if interval_s <= 0:
            raise ConfigError(f"--interval must be a positive number of seconds, not {interval_s}")
        return replace(item, cron=None, interval=datetime.timedelta(seconds=interval_s))
    return item


def _schedule(item: DeploymentSpec):
    from prefect.schedules import Cron, Interval

    slug = f"{item.name}-schedule"
    if item.cron is not None:
        return Cron(item.cron, timezone=item.timezone, slug=slug)
    return Interval(item.interval, anchor_date=INTERVAL_ANCHOR, timezone=item.timezone, slug=slug)


def _concurrency(item: DeploymentSpec):
    """Prefect's own deployment concurrency: two scheduled runs never promote on one registry
    at once; a late run waits for the slot."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    return ConcurrencyLimitConfig(
        limit=item.concurrency_limit, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
    )


def require_api_url() -> str:
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        raise ServiceUnreachableError(
            "no Prefect server to deploy to: start the stack with `trainflow up` "
            "(or export PREFECT_API_URL)"
        )
    return url


def deploy_all(
    pool: str,
    names: list[str] | None = None,
    overrides: list[str] | None = None,
    schedule: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Create or update the deployments on ``PREFECT_API_URL``; returns name, id and schedule.

    ``overrides`` (``KEY=VALUE``) change the config parameter of the ``names`` deployments,
    ``schedule`` (``cron=`` or ``interval_s=``, with_schedule) their schedule."""
    api_url = require_api_url()
    from prefect import flow

    if (overrides or schedule) and not names:
        raise ConfigError("name the deployment (--name) whose config or schedule to change")
    chosen = [with_schedule(spec(name), **(schedule or {})) for name in names or []]
    chosen = chosen or list(DEPLOYMENTS)
    flows = {}
    deployed = []
    for item in chosen:
        schedule = _schedule(item)
        if item.entrypoint not in flows:
            flows[item.entrypoint] = flow.from_source(
                source=str(REPO_ROOT), entrypoint=item.entrypoint
            )
        deployment_id = flows[item.entrypoint].deploy(
            name=item.name,
            work_pool_name=pool,
            schedules=[schedule],
            paused=item.paused,
            parameters=spec_parameters(item, overrides),
            description=item.description,
            tags=list(item.tags),
            concurrency_limit=_concurrency(item),
            build=False,
            push=False,
            print_next_steps=False,
            ignore_warnings=True,
        )
        if not item.paused:
            schedule_next_runs(api_url, str(deployment_id))
        deployed.append(
            {
                "name": f"{FLOW_NAME}/{item.name}",
                "id": str(deployment_id),
                "schedule": f"cron {item.cron}" if item.cron else f"every {item.interval}",
                "timezone": item.timezone,
                "paused": item.paused,
            }
        )
    return deployed


def schedule_next_runs(api_url: str, deployment_id: str) -> None:
    """Have the server create the next scheduled runs now, as its scheduler loop would within a
    minute, so that `trainflow status` shows them right after a deploy."""
    from deployments.prefect_api import prefect_client, unreachable_errors

    # A busy server on sqlite answers 503 while its database is locked: the client tries again,
    # backing off, a few times. Not worth failing a deploy for: the scheduler creates the runs.
    try:
        with prefect_client(
            api_url, retries=SCHEDULE_RETRIES, timeout=SCHEDULE_TIMEOUT_S
        ) as client:
            client.request(
                "POST", "/deployments/{id}/schedule", path_params={"id": deployment_id}, json={}
            )
        return
    except unreachable_errors():
        pass
    log.warning(
        "the Prefect server did not schedule the next runs of deployment %s now; its scheduler "
        "will within a minute",
        deployment_id,
    )


def trigger(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start a run of deployment ``pipeline/<name>`` now; ``overrides`` (a validated config dump)
    replace its config parameter. Returns the flow run's id and name."""
    require_api_url()
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    parameters = {"config": overrides} if overrides is not None else None
    try:
        flow_run = run_deployment(
            name=f"{FLOW_NAME}/{name}", parameters=parameters, timeout=0, as_subflow=False
        )
    except ObjectNotFound:
        raise TrainflowError(
            f"no deployment {FLOW_NAME}/{name} on the Prefect server; run `trainflow deploy` first"
        ) from None
    return {"id": str(flow_run.id), "name": flow_run.name}


def _read_deployment(client, name: str):
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
    except ObjectNotFound:
        raise TrainflowError(
            f"no deployment {FLOW_NAME}/{name} on the Prefect server; run `trainflow deploy` first"
        ) from None


def deployment_parameters(name: str) -> dict[str, Any]:
    """The ``config`` parameter stored on deployment ``pipeline/<name>``."""
    from deployments.prefect_api import prefect_client

    with prefect_client(require_api_url()) as client:
        deployment = _read_deployment(client, name)
    return dict(deployment.parameters.get("config") or {})


def set_paused(name: str, paused: bool) -> str:
    """Pause or resume the schedule of deployment ``pipeline/<name>`` (Prefect's own pause: the
    server drops a paused deployment's scheduled runs); a resumed one gets its next runs now.
    Returns the deployment's id."""
    from deployments.prefect_api import prefect_client

    api_url = require_api_url()
    with prefect_client(api_url) as client:
        deployment = _read_deployment(client, name)
        if paused:
            client.pause_deployment(deployment.id)
        else:
            client.resume_deployment(deployment.id)
    if not paused:
        schedule_next_runs(api_url, str(deployment.id))
    return str(deployment.id)
