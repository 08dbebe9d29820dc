"""The run's record of tracking outages: log lines, the epoch rows' outage, the parent run's
table and tag (a fake client; the e2e test reads a real server's)."""

from __future__ import annotations

import logging
from dataclasses import asdict

import pytest

from training.errors import TrackingUnavailableError
from training.tracking import outage_record

URL = "http://user:s3cret@mlflow.example:5000"
GONE = ConnectionError("Max retries exceeded with url: /api/2.0/mlflow/runs/log-batch")


@pytest.fixture(autouse=True)
def fresh_record():
    outage_record.reset()
    yield
    outage_record.reset()


class FakeClient:
    def __init__(self, tags: dict[str, str] | None = None) -> None:
        self.tags = dict(tags or {})
        self.tables: list[tuple[str, dict, str]] = []

    def get_run(self, run_id):
        data = type("Data", (), {"tags": dict(self.tags)})
        return type("Run", (), {"data": data})

    def log_table(self, run_id, data, artifact_file):
        self.tables.append((run_id, data, artifact_file))

    def set_tag(self, run_id, key, value):
        self.tags[key] = value


def test_an_outage_that_ended_is_a_log_line_in_utc_without_credentials(caplog):
    with caplog.at_level(logging.WARNING, logger="trainflow.outages"):
        outage = outage_record.ended(URL, 1_700_000_000.0, "the evaluate stage", 1_700_000_042.0)
    assert outage.started == "2023-11-14T22:13:20+00:00"
    assert outage.ended == "2023-11-14T22:14:02+00:00" and outage.seconds == 42.0
    assert "s3cret" not in caplog.text and "s3cret" not in outage.what
    assert "mlflow.example:5000" in outage.what
    assert "from 2023-11-14T22:13:20+00:00 to 2023-11-14T22:14:02+00:00 (42 s)" in caplog.text
    assert "waited: the evaluate stage" in caplog.text
    assert outage_record.recorded() == [outage]


def test_a_wait_is_recorded_when_it_ends_or_gives_up(caplog):
    with outage_record.watch(URL, "the train stage"):
        pass
    with (
        caplog.at_level(logging.WARNING, logger="trainflow.outages"),
        pytest.raises(TrackingUnavailableError),
        outage_record.watch(URL, "the evaluate stage"),
    ):
        raise TrackingUnavailableError("past the grace")
    first, second = outage_record.recorded()
    assert first.waited == "the train stage"
    assert second.waited == (
        "the evaluate stage, stopped (the server did not answer within the grace)"
    )
    assert "waited: the evaluate stage, stopped" in caplog.text


def test_the_epoch_rows_outage_spans_the_failed_sends_to_the_next_that_reached_the_server():
    answering = [True, False, False, True]
    sent: list[list[int]] = []

    def sink(rows):
        if not answering.pop(0):
            raise GONE
        sent.append([r["epoch"] for r in rows])

    send = outage_record.watched(sink, URL, "the training's epoch rows")
    send([{"epoch": 1}])
    for rows in ([{"epoch": 2}], [{"epoch": 2}, {"epoch": 3}]):
        with pytest.raises(ConnectionError):
            send(rows)
    send([{"epoch": 2}, {"epoch": 3}, {"epoch": 4}])
    assert sent == [[1], [2, 3, 4]]
    (outage,) = outage_record.recorded()
    assert outage.waited == "the training's epoch rows (epochs 2-4)"


def test_a_failure_that_is_not_the_server_gone_is_no_outage():
    failures = [ValueError("a metric value that is not a number")]

    def sink(rows):
        if failures:
            raise failures.pop()

    send = outage_record.watched(sink, URL, "the training's epoch rows")
    with pytest.raises(ValueError):
        send([{"epoch": 1}])
    send([{"epoch": 1}, {"epoch": 2}])
    assert outage_record.recorded() == []


def test_the_parent_run_gets_each_outage_once_as_a_table_row_and_the_count_as_a_tag():
    client = FakeClient(tags={outage_record.COUNT_TAG: "1"})  # a stopped run's, before resume
    assert outage_record.write(client, "parent") == 0 and client.tables == []
    outage_record.ended(URL, 1_700_000_000.0, "the train stage", 1_700_000_010.0)
    outage_record.ended(URL, 1_700_000_100.0, "the evaluate stage", 1_700_000_130.0)
    assert outage_record.write(client, "parent") == 2
    ((run, table, name),) = client.tables
    assert (run, name) == ("parent", "outages.json")
    assert table["waited"] == ["the train stage", "the evaluate stage"]
    assert table["seconds"] == [10.0, 30.0]
    assert set(table) == {"what", "started", "ended", "seconds", "waited"}
    assert client.tags[outage_record.COUNT_TAG] == "3"
    assert outage_record.write(client, "parent") == 0  # written once
    assert len(client.tables) == 1


def test_a_stopped_run_keeps_what_mlflow_did_not_take_and_its_resume_writes_it(tmp_path):
    pending = str(tmp_path / "runs" / "r1" / "outages-pending.json")
    outage_record.keep_pending(pending)  # nothing to keep: no file
    assert not (tmp_path / "runs").exists()
    outage_record.ended(URL, 1_700_000_000.0, "the train stage, stopped", 1_700_000_015.0)
    outage_record.keep_pending(pending)  # the server is gone: the run stops
    stopped = outage_record.recorded()
    outage_record.reset()  # the resume, a new process
    assert outage_record.load_pending(pending) == 1
    assert outage_record.recorded() == stopped
    client = FakeClient()
    assert outage_record.write(client, "parent") == 1
    outage_record.keep_pending(pending)  # written: the file says so
    outage_record.reset()
    assert outage_record.load_pending(pending) == 0
    assert client.tags[outage_record.COUNT_TAG] == "1"


def test_the_run_summary_says_how_often_mlflow_was_away_in_one_line():
    from test_report import synthetic_summary

    from trainflow.render import summary_lines
    from training.summary import RunSummary

    summary = synthetic_summary()
    assert not [line for line in summary_lines(summary) if line.startswith("outages")]
    summary.outages = [
        asdict(outage_record.ended(URL, 1_700_000_000.0, "the train stage", 1_700_000_010.0)),
        asdict(outage_record.ended(URL, 1_700_000_100.0, "the evaluate stage", 1_700_000_130.5)),
    ]
    (line,) = [line for line in summary_lines(summary) if line.startswith("outages")]
    assert line.endswith("MLflow did not answer 2 time(s), 40 s in all")
    assert RunSummary.from_dict(summary.to_dict()).outages == summary.outages


def test_a_stage_that_waits_during_the_epoch_rows_outage_dates_it_from_the_first_failed_send(
    monkeypatch,
):
    now = [1_700_000_000.0]
    monkeypatch.setattr(outage_record.time, "time", lambda: now[0])
    answering = [False]

    def sink(rows):
        if not answering.pop(0):
            raise GONE

    send = outage_record.watched(sink, URL, "the training's epoch rows")
    with pytest.raises(ConnectionError):
        send([{"epoch": 2}])
    now[0] += 100  # the training ends; its stage meets the server gone
    with pytest.raises(RuntimeError), outage_record.watch(URL, "the train stage"):
        now[0] += 15
        raise RuntimeError("past the grace")
    (stage,) = outage_record.recorded()
    assert stage.started == "2023-11-14T22:13:20+00:00" and stage.seconds == 115.0
