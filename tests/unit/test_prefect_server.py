"""The CLI's early start of Prefect's temporary server: only when Prefect would start one, on
the instance Prefect's client uses, and never an error of its own."""

from __future__ import annotations

import threading
import time

import pytest
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, temporary_settings

from trainflow.prefect_server import EarlyTemporaryServer


@pytest.fixture
def starts(monkeypatch):
    """Every SubprocessASGIServer.start call: (instance, thread name, finished)."""
    calls = []

    def start(self, timeout=None):
        call = {"server": self, "thread": threading.current_thread().name, "done": False}
        calls.append(call)
        time.sleep(0.3)  # a server that takes a while to answer
        call["done"] = True

    monkeypatch.setattr(SubprocessASGIServer, "start", start)
    return calls


def test_starts_the_clients_own_server_in_a_thread_and_waits_for_it(starts):
    with temporary_settings(
        updates={PREFECT_API_URL: None, PREFECT_SERVER_EPHEMERAL_ENABLED: True}
    ):
        early = EarlyTemporaryServer()
        assert early.started
        early.wait()
    [call] = starts
    assert call["done"], "wait() returned before the server answered"
    assert call["thread"] != threading.main_thread().name
    # Prefect's client gets the same instance (one per port; the temporary one has none).
    assert call["server"] is SubprocessASGIServer()


@pytest.mark.parametrize(
    "settings",
    [
        {PREFECT_API_URL: "http://127.0.0.1:4200/api", PREFECT_SERVER_EPHEMERAL_ENABLED: True},
        {PREFECT_API_URL: None, PREFECT_SERVER_EPHEMERAL_ENABLED: False},
    ],
    ids=["a server is configured", "temporary servers are off"],
)
def test_nothing_starts_where_prefect_would_start_nothing(starts, settings):
    with temporary_settings(updates=settings):
        early = EarlyTemporaryServer()
        early.wait()
    assert not early.started and starts == []


def test_a_failed_early_start_is_logged_not_raised(monkeypatch, caplog):
    def start(self, timeout=None):
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")

    monkeypatch.setattr(SubprocessASGIServer, "start", start)
    with temporary_settings(
        updates={PREFECT_API_URL: None, PREFECT_SERVER_EPHEMERAL_ENABLED: True}
    ):
        early = EarlyTemporaryServer()
        early.wait()
    assert "did not start early" in caplog.text and "Timed out" in caplog.text
