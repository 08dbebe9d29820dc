"""A Prefect server that stops answering mid-run: the client's retry budget trainflow sets, and
the one error a run ends with when the server never comes back."""

from __future__ import annotations

import sys
import types

import anyio
import httpx
import pytest

from deployments.stack import PREFECT_CLIENT_RETRIES, service_environment
from trainflow import flow_call
from trainflow.prefect_outage import (
    PrefectUnavailableError,
    explained,
    retry_budget_s,
    stop_waiting,
)

API = "http://127.0.0.1:4321/api"


def _connect_error(url: str) -> httpx.ConnectError:
    return httpx.ConnectError("[Errno 111] Connection refused", request=httpx.Request("POST", url))


def test_every_process_of_ours_gets_the_longer_client_retries(tmp_path, monkeypatch):
    from prefect.settings import Settings

    value = service_environment(tmp_path)["PREFECT_CLIENT_MAX_RETRIES"]
    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", value)
    assert Settings().client.max_retries == PREFECT_CLIENT_RETRIES == 7


def test_the_budget_is_what_prefects_client_sleeps(monkeypatch):
    """Prefect's own retry loop, against a server that refuses every connection: its sleeps
    (jitter off) add up to retry_budget_s, and the last failure is raised."""
    from prefect.client.base import PrefectHttpxAsyncClient
    from prefect.settings import temporary_settings

    slept: list[float] = []

    async def no_sleep(seconds: float) -> None:
        slept.append(seconds)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    monkeypatch.setattr("prefect.client.base.anyio.sleep", no_sleep)

    async def send() -> None:
        async with PrefectHttpxAsyncClient(transport=httpx.MockTransport(refuse)) as client:
            client._has_connected = True  # the flow's client connected when the run began
            await client.get(f"{API}/health")

    updates = {"PREFECT_CLIENT_MAX_RETRIES": 7, "PREFECT_CLIENT_RETRY_JITTER_FACTOR": 0}
    with temporary_settings(updates=updates), pytest.raises(httpx.ConnectError):
        anyio.run(send)
    assert slept == [2, 4, 8, 16, 32, 64, 128]
    assert sum(slept) == retry_budget_s(7) == 254
    assert retry_budget_s(5) == 62  # Prefect's default: shorter than a server's restart


def test_the_api_not_answering_is_one_error_naming_the_server_and_the_fix(monkeypatch):
    from prefect.settings import temporary_settings

    monkeypatch.setenv("PREFECT_API_URL", API + "/")
    with temporary_settings(updates={"PREFECT_CLIENT_MAX_RETRIES": 7}):
        error = explained(_connect_error(f"{API}/flow_runs/abc/set_state"), "run1")
    assert isinstance(error, PrefectUnavailableError)
    message = str(error)
    assert API in message and "254 s" in message and "PREFECT_CLIENT_MAX_RETRIES" in message
    assert "`trainflow up`" in message and "`trainflow run --resume run1`" in message
    assert "--resume RUN_ID" in str(explained(_connect_error(f"{API}/logs/"), None))


def test_the_outage_is_found_behind_the_error_that_reported_it(monkeypatch):
    """The flow engine's failed attempt to report a failed call: the last error raised."""
    monkeypatch.setenv("PREFECT_API_URL", API)
    try:
        try:
            raise _connect_error(f"{API}/artifacts/")
        except httpx.ConnectError as first:
            raise RuntimeError("reporting the failure failed") from first
    except RuntimeError as exc:
        assert isinstance(explained(exc, "run1"), PrefectUnavailableError)


@pytest.mark.parametrize(
    ("api_url", "exc"),
    [
        (API, _connect_error("https://huggingface.co/api/models/x")),  # another service
        (API, ValueError("not a connection error")),
        (API, httpx.ConnectError("no request")),
        ("", _connect_error(f"{API}/logs/")),  # Prefect's temporary server: not ours to name
    ],
)
def test_other_errors_keep_their_own_report(monkeypatch, api_url, exc):
    monkeypatch.setenv("PREFECT_API_URL", api_url)
    assert explained(exc, "run1") is None


def test_after_the_outage_error_no_thread_waits_for_the_server_again(monkeypatch):
    """Prefect's log and events workers run in threads of their own, which read the
    process-global settings: a process that gave up on the server exits without retrying."""
    import threading

    from prefect.context import refresh_global_settings_context
    from prefect.settings import get_current_settings

    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", "7")
    refresh_global_settings_context()
    try:
        stop_waiting()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(get_current_settings()))
        thread.start()
        thread.join()
        assert seen[0].client.max_retries == 0
    finally:
        monkeypatch.undo()
        refresh_global_settings_context()


def test_run_flow_ends_with_the_outage_error(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", API)
    fake = types.ModuleType("flows.pipeline")

    def pipeline(config, run_id):
        raise _connect_error(f"{API}/flow_runs/abc/set_state")

    fake.pipeline = pipeline
    monkeypatch.setitem(sys.modules, "flows.pipeline", fake)
    stopped = []
    monkeypatch.setattr(flow_call, "stop_waiting", lambda: stopped.append(True))
    with pytest.raises(PrefectUnavailableError) as raised:
        flow_call.run_flow(None, "run1", None)
    assert isinstance(raised.value.__cause__, httpx.ConnectError)
    assert stopped == [True]
