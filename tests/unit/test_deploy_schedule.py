"""``schedule_next_runs``: retried on a busy Prefect server, never fails a deploy."""

from __future__ import annotations

import http.server
import logging
import threading

import pytest

from deployments import deploy


@pytest.fixture
def server():
    """A loopback HTTP server answering each POST with the next status of ``answers``."""
    answers: list[int] = []
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the http.server API)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            paths.append(self.path)
            status = answers.pop(0) if answers else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/api", answers, paths
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def waits(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(deploy.time, "sleep", slept.append)
    return slept


def test_busy_server_is_retried_until_it_schedules(server, waits, caplog):
    url, answers, paths = server
    answers.extend([503, 503])
    with caplog.at_level(logging.WARNING):
        deploy.schedule_next_runs(url, "dep-1")
    assert paths == ["/api/deployments/dep-1/schedule"] * 3
    assert waits == [1, 2]
    assert "did not schedule" not in caplog.text


def test_client_error_is_not_retried_and_only_warns(server, waits, caplog):
    url, answers, paths = server
    answers.append(404)
    with caplog.at_level(logging.WARNING):
        deploy.schedule_next_runs(url, "missing")
    assert len(paths) == 1 and waits == []
    assert "did not schedule the next runs of deployment missing" in caplog.text


def test_a_server_busy_every_time_gives_up_after_five_tries_without_raising(server, waits, caplog):
    url, answers, paths = server
    answers.extend([503] * 10)
    with caplog.at_level(logging.WARNING):
        deploy.schedule_next_runs(url, "dep-2")
    assert len(paths) == 5 and waits == [1, 2, 4, 8]
    assert "scheduler will within a minute" in caplog.text
