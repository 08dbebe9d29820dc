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


def test_a_fresh_home_gets_the_first_homes_migrated_database(monkeypatch, tmp_path):
    """The first home's server migrates and its database becomes the template; the next fresh
    home starts from a copy of it (and of Prefect's block-registration memo)."""
    import sqlite3

    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, PREFECT_MEMO_STORE_PATH

    from training.platform import fast_start

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(fast_start.SWITCH_ENV, raising=False)
    found = []
    homes = []

    def start(self, timeout=None):
        """Stands in for the server: records what the home held, then 'migrates'."""
        with sqlite3.connect(homes[-1] / "prefect.db") as conn:
            found.append(conn.execute("SELECT name FROM sqlite_master").fetchall())
            conn.execute("CREATE TABLE IF NOT EXISTS migrated (v INTEGER)")
        conn.close()
        (homes[-1] / "memo_store.toml").write_text('block_auto_registration = "abc"\n')

    monkeypatch.setattr(SubprocessASGIServer, "start", start)
    for name in ("first", "second"):
        home = tmp_path / name
        home.mkdir()
        homes.append(home)
        updates = {
            PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{home / 'prefect.db'}",
            PREFECT_MEMO_STORE_PATH: home / "memo_store.toml",
            PREFECT_API_URL: None,
            PREFECT_SERVER_EPHEMERAL_ENABLED: True,
        }
        with temporary_settings(updates=updates):
            EarlyTemporaryServer().wait()
    assert found == [[], [("migrated",)]]
    memo = (tmp_path / "second" / "memo_store.toml").read_text()
    assert memo == 'block_auto_registration = "abc"\n'
