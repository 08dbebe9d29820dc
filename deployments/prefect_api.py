"""What trainflow asks a Prefect server, through Prefect's own client: the work pool, its
workers, the deployments and their next runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from training.errors import ServiceUnreachableError

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

# A probe (is the worker there yet?) asks once and quickly: no retries, a short timeout.
PROBE_TIMEOUT_S = 3.0


@contextlib.contextmanager
def prefect_client(
    api_url: str, retries: int | None = None, timeout: float | None = None
) -> Iterator[SyncPrefectClient]:
    """A sync Prefect client bound to ``api_url`` (whatever the profile says).

    ``retries``: how often the client re-sends a request the server answered 429/502/503 or
    that timed out (Prefect's default when None); ``timeout``: seconds per request.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    settings: dict[Any, Any] = {PREFECT_API_URL: api_url}
    if retries is not None:
        settings[PREFECT_CLIENT_MAX_RETRIES] = retries
    httpx_settings = {"timeout": timeout} if timeout is not None else None
    with (
        temporary_settings(settings),
        get_client(httpx_settings=httpx_settings, sync_client=True) as client,
    ):
        yield client


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """What a client request raises when the server is down, busy or refuses the request."""
    import httpx
    from prefect.exceptions import ObjectNotFound

    # PrefectHTTPStatusError is an httpx.HTTPStatusError; a 404 may come as ObjectNotFound.
    return (httpx.HTTPError, ObjectNotFound, OSError)


def ensure_work_pool(api_url: str, pool: str) -> bool:
    """Create the process work pool (with Prefect's default job template) if missing."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with prefect_client(api_url) as client:
        try:
            client.read_work_pool(pool)
            return False
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=pool,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                )
            )
            return True


def pool_workers(api_url: str, pool: str) -> list[str]:
    """Names of the workers the server has heard from in the pool (none if it does not answer)."""
    try:
        with prefect_client(api_url, retries=0, timeout=PROBE_TIMEOUT_S) as client:
            return [worker.name for worker in client.read_workers_for_work_pool(pool)]
    except unreachable_errors():
        return []


def deployments_overview(api_url: str, next_runs: int = 3) -> list[dict[str, Any]]:
    """Each deployment: name, schedules (cron/interval, timezone, active), paused, next runs."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    scheduled = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
    )
    overview = []
    try:
        with prefect_client(api_url, retries=0, timeout=PROBE_TIMEOUT_S) as client:
            for deployment in sorted(client.read_deployments(limit=200), key=lambda d: d.name):
                runs = client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                    flow_run_filter=scheduled,
                    sort=FlowRunSort.EXPECTED_START_TIME_ASC,
                    limit=next_runs,
                )
                overview.append(
                    {
                        "name": deployment.name,
                        "id": str(deployment.id),
                        "paused": deployment.paused,
                        "schedules": [_describe_schedule(s) for s in deployment.schedules or []],
                        # As the API writes them (ISO 8601, UTC as "Z").
                        "next_runs": [
                            run.model_dump(mode="json")["expected_start_time"] for run in runs
                        ],
                    }
                )
    except unreachable_errors() as exc:
        raise ServiceUnreachableError(
            f"Prefect API {api_url} is not reachable ({exc}); start it with `trainflow up`"
        ) from None
    return overview


def _describe_schedule(entry: Any) -> dict[str, Any]:
    """A deployment schedule in a few words: ``cron 0 2 * * *`` or ``every 21600.0 s``."""
    schedule = entry.schedule
    if getattr(schedule, "cron", None):
        text = f"cron {schedule.cron}"
    elif getattr(schedule, "interval", None):
        text = f"every {schedule.interval.total_seconds()} s"
    else:
        text = str(schedule)
    return {
        "schedule": text,
        "timezone": getattr(schedule, "timezone", None),
        "active": entry.active,
    }
