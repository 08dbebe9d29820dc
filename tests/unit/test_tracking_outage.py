"""Waiting out a tracking server's blip inside a stage (training.tracking.outage): what counts
as the server being gone, the wait within the grace and its console lines, and the retriable
error that makes Prefect run the stage again."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException

from tasks.policy import retry_unless_bad_input
from training import progress
from training.config import MlflowConfig, PipelineConfig
from training.errors import (
    ConfigError,
    ServiceUnreachableError,
    TrackingBlipError,
    TrackingUnavailableError,
    is_retriable,
)
from training.stages import blips
from training.tracking import outage

GONE = MlflowException(
    "API request to http://127.0.0.1:5471/api/2.0/mlflow/runs/get failed with exception "
    "HTTPConnectionPool(host='127.0.0.1', port=5471): Max retries exceeded with url: ..."
)


class FakeServer:
    """Health checks that fail ``down_for`` times, on a clock that each sleep moves on."""

    def __init__(self, down_for: int) -> None:
        self.down_for, self.now, self.checks = down_for, 0.0, 0

    def check(self, uri: str) -> None:
        self.checks += 1
        if self.checks <= self.down_for:
            raise ServiceUnreachableError(f"MLflow tracking server {uri} is not reachable")

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def said(monkeypatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(progress, "report", lambda stage, line, **_: lines.append(line))
    return lines


def test_the_clients_connection_failures_count_as_the_server_gone():
    assert outage.is_server_gone(GONE)
    assert outage.is_server_gone(ConnectionRefusedError(111, "Connection refused"))
    try:  # chained: the stage wrapped the client's error in its own
        try:
            raise GONE
        except MlflowException as inner:
            raise RuntimeError("could not log the test metrics") from inner
    except RuntimeError as outer:
        assert outage.is_server_gone(outer)
    assert not outage.is_server_gone(ValueError("could not convert string to float: 'x'"))
    assert not outage.is_server_gone(MlflowException("RESOURCE_DOES_NOT_EXIST: no run 'abc'"))
    assert not outage.is_server_gone(ConfigError("Max retries exceeded is in this message"))


def test_the_wait_says_so_and_ends_when_the_server_answers(said):
    server = FakeServer(down_for=12)
    waited = outage.wait_until_answering(
        "http://127.0.0.1:5471", 600, "train", server.check, server.clock, server.sleep
    )
    assert waited == pytest.approx(24.0)  # 12 failed polls, 2 s apart
    assert said[0] == "MLflow at http://127.0.0.1:5471 not answering; waiting (0 s of 600 s)"
    assert any(
        line.startswith("MLflow at http://127.0.0.1:5471 not answering; waiting (1")
        for line in said[1:-1]
    )
    assert said[-1] == "MLflow at http://127.0.0.1:5471 answers again after 24 s"
    assert len(said) <= 5  # a line every 10 s, not one per poll


def test_past_the_grace_the_run_stops_naming_the_server_and_the_resume(said):
    server = FakeServer(down_for=10**6)
    with pytest.raises(TrackingUnavailableError) as raised:
        outage.wait_until_answering(
            "http://user:s3cret@mlflow.example:5000",
            30,
            "promote",
            server.check,
            server.clock,
            server.sleep,
        )
    message = str(raised.value)
    assert "has not answered for 30 s" in message and "mlflow.outage_grace_s" in message
    assert "trainflow run --resume" in message
    named = str(raised.value.naming("r1"))
    assert named == message.replace("--resume <run id>", "--resume r1")
    assert "s3cret" not in message and "s3cret" not in " ".join(said)
    assert not is_retriable(raised.value) and not raised.value.user_error  # exit 1, no retry


def _config(uri: str, grace: float = 600) -> PipelineConfig:
    return PipelineConfig(mlflow=MlflowConfig(tracking_uri=uri, outage_grace_s=grace))


def test_a_stage_that_lost_the_server_runs_again_once_it_answers(monkeypatch, said):
    server = FakeServer(down_for=3)
    monkeypatch.setattr("training.tracking.store.check_reachable", server.check)
    monkeypatch.setattr(outage.time, "sleep", server.sleep)
    monkeypatch.setattr(outage.time, "monotonic", server.clock)
    config = _config("http://127.0.0.1:5471")
    with pytest.raises(TrackingBlipError) as raised, blips.tracking_blips(config, "evaluate"):
        raise GONE
    assert is_retriable(raised.value) and raised.value.__cause__ is GONE
    assert "evaluate runs again" in str(raised.value)
    assert server.checks == 4  # gone? (no), then the wait: two more fail, the fourth answers


def test_a_connection_error_while_mlflow_answers_is_not_waited_for(monkeypatch, said):
    """Another service's connection error (S3's endpoint) while the MLflow server answers: the
    stage's own error goes on unchanged."""
    s3 = OSError("Could not connect to the endpoint URL: Connection refused (S3)")
    server = FakeServer(down_for=0)
    monkeypatch.setattr("training.tracking.store.check_reachable", server.check)
    config = _config("http://127.0.0.1:5471")
    with pytest.raises(OSError) as raised, blips.tracking_blips(config, "train"):
        raise s3
    assert raised.value is s3 and server.checks == 1 and said == []


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("sqlite:////tmp/mlflow.db", GONE),  # no server to wait for
        ("http://127.0.0.1:5471", ValueError("a bug, not a blip")),
        ("http://127.0.0.1:5471", ConfigError("bad config")),
    ],
)
def test_other_failures_pass_through_unchanged(monkeypatch, uri, error):
    monkeypatch.setattr("training.tracking.store.check_reachable", pytest.fail)
    with pytest.raises(type(error)) as raised, blips.tracking_blips(_config(uri), "train"):
        raise error
    assert raised.value is error


def test_prefect_retries_the_blip_and_not_the_outage_past_the_grace():
    class State:
        def __init__(self, exc):
            self.data = exc

    assert retry_unless_bad_input(None, None, State(TrackingBlipError("back")))
    assert not retry_unless_bad_input(None, None, State(TrackingUnavailableError("gone")))
