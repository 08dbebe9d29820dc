"""``schedule_next_runs``: retried on a busy Prefect server, never fails a deploy.

The request goes through Prefect's client, whose own back-off retries it: after 2, 4 and 8 s,
and after its last try it waits 16 s more before giving up.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time

import pytest

from deployments import deploy


@pytest.fixture
def server():
    """A loopback HTTP server answering each POST with the next status of ``answers``, and the
    client's CSRF-token request as a Prefect server without CSRF protection does."""
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

        def do_GET(self):  # noqa: N802 (the http.server API)
            body = b'{"detail": "CSRF protection is disabled."}'
            self.send_response(422)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

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
    """The client's back-off sleeps, recorded instead of slept, without jitter."""
    from prefect.settings import PREFECT_CLIENT_RETRY_JITTER_FACTOR, temporary_settings

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    with temporary_settings({PREFECT_CLIENT_RETRY_JITTER_FACTOR: 0}):
        yield slept


def test_busy_server_is_retried_until_it_schedules(server, waits, caplog):
    url, answers, paths = server
    answers.extend([503, 503])
    with caplog.at_level(logging.WARNING):
        deploy.schedule_next_runs(url, "dep-1")
    assert paths == ["/api/deployments/dep-1/schedule"] * 3
    assert waits == [2, 4]
    assert "did not schedule" not in caplog.text


def test_client_error_is_not_retried_and_only_warns(server, waits, caplog):
    url, answers, paths = server
    answers.append(404)
    with caplog.at_level(logging.WARNING):
        deploy.schedule_next_runs(url, "missing")
    assert len(paths) == 1 and waits == []
    assert "did not schedule the next runs of deployment missing" in caplog.text


def test_a_server_busy_every_time_gives_up_after_four_tries_without_raising(server, waits, caplog):
    url, answers, paths = server
    answers.extend([503] * 10)
    with caplog.at_level(logging.WARNING):
        deploy.schedule_next_runs(url, "dep-2")
    assert len(paths) == 4 and waits == [2, 4, 8, 16]
    assert "scheduler will within a minute" in caplog.text


# ------------------------------------------------- a deployment's schedule and config, chosen


def test_a_cron_or_an_interval_replaces_the_deployments_schedule_and_keeps_it_paused():
    import datetime

    from training.errors import ConfigError

    score = deploy.spec("score")
    every = deploy.with_schedule(score, interval_s=60)
    assert every.interval == datetime.timedelta(seconds=60) and every.cron is None
    assert every.paused and every.timezone == score.timezone
    assert deploy._schedule(every).interval == datetime.timedelta(seconds=60)
    daily = deploy.with_schedule(score, cron="30 5 * * 1-5")
    assert daily.cron == "30 5 * * 1-5" and daily.interval is None
    assert deploy.with_schedule(score) == score
    for wrong in ({"cron": "every day"}, {"interval_s": 0}, {"cron": "* * * * *", "interval_s": 9}):
        with pytest.raises(ConfigError):
            deploy.with_schedule(score, **wrong)


def test_overrides_change_the_deployments_config_parameter_and_are_validated():
    from training.errors import ConfigError

    score = deploy.spec("score")
    config = deploy.spec_parameters(score, ["data.source=s3://b/new/", "mlflow.registered_model=m"])
    assert config["config"]["data"]["source"] == "s3://b/new/"
    assert config["config"]["mlflow"]["registered_model"] == "m"
    with pytest.raises(ConfigError):
        deploy.spec_parameters(score, ["train.lr=-1"])


def test_a_schedule_or_overrides_need_the_deployments_name(monkeypatch):
    from training.errors import ConfigError

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    with pytest.raises(ConfigError, match="--name"):
        deploy.deploy_all("pool", None, ["data.source=x.parquet"])
    with pytest.raises(ConfigError, match="--name"):
        deploy.deploy_all("pool", [], None, {"interval_s": 60})
