"""The start-up speed-ups' one switch: ``TRAINFLOW_FAST_START=0`` turns each of them off."""

from __future__ import annotations

import atexit
import os
import sqlite3
import threading

import pytest

from trainflow import prefect_server, startup
from training.config import RayConfig
from training.platform import cluster, db_templates


@pytest.fixture(params=[True, False], ids=["on", "off"])
def fast(request, monkeypatch):
    """Each test runs with the speed-ups on (the default: the switch unset) and off."""
    if request.param:
        monkeypatch.delenv(startup.SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(startup.SWITCH_ENV, "0")
    return request.param


def test_the_early_ray_start(fast, monkeypatch):
    calls = []
    monkeypatch.setattr(cluster, "start_early", lambda *args: calls.append(args))
    assert startup.start_ray_early(RayConfig(), []) is fast
    assert calls == ([(RayConfig(), [])] if fast else [])


def test_prefects_early_server(fast, monkeypatch):
    made = []
    monkeypatch.setattr(prefect_server, "EarlyTemporaryServer", lambda: made.append(1) or "early")
    assert startup.start_prefect_early() == ("early" if fast else None)
    assert made == ([1] if fast else [])


def test_the_database_templates(fast, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "migrated.db"
    with sqlite3.connect(source) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    db_templates.save(source, "lib", "1.0")
    assert db_templates.template_path("lib", "1.0").is_file() is fast
    # A template made while on is not used while off.
    monkeypatch.delenv(startup.SWITCH_ENV, raising=False)
    db_templates.save(source, "lib", "1.0")
    if not fast:
        monkeypatch.setenv(startup.SWITCH_ENV, "0")
    target = tmp_path / "home" / "fresh.db"
    assert db_templates.seed(target, "lib", "1.0", None) is fast
    assert target.exists() is fast


def test_the_quick_exit(fast, monkeypatch):
    steps = []
    monkeypatch.setattr(threading, "_shutdown", lambda: steps.append("threads"))
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: steps.append("atexit"))

    def fake_exit(code):
        steps.append(("_exit", code))
        raise RuntimeError("os._exit")

    monkeypatch.setattr(os, "_exit", fake_exit)
    if fast:
        with pytest.raises(RuntimeError, match="os._exit"):
            startup.exit_promptly(3)
        assert steps == ["threads", "atexit", ("_exit", 3)]
    else:
        with pytest.raises(SystemExit) as exited:
            startup.exit_promptly(3)
        assert exited.value.code == 3 and steps == []


def test_the_exit_code_is_decided_after_the_exit_hooks(fast, monkeypatch):
    """A Ctrl-C while the hooks run (Prefect's queues drain, its server stops) interrupts the
    joins, not the exit; ``last_word`` then gives the code (130: trainflow/interrupts.py)."""
    steps = []

    def interrupted_join():
        steps.append("threads")
        raise KeyboardInterrupt

    monkeypatch.setattr(threading, "_shutdown", interrupted_join)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: steps.append("atexit"))

    def fake_exit(code):
        steps.append(("_exit", code))
        raise RuntimeError("os._exit")

    def last_word(code):
        steps.append(("last word", code))
        return 130

    monkeypatch.setattr(os, "_exit", fake_exit)
    if fast:
        with pytest.raises(RuntimeError, match="os._exit"):
            startup.exit_promptly(0, last_word=last_word)
        assert steps == ["threads", "atexit", ("last word", 0), ("_exit", 130)]
    else:
        with pytest.raises(SystemExit) as exited:
            startup.exit_promptly(0, last_word=last_word)
        assert exited.value.code == 130 and steps == [("last word", 0)]
