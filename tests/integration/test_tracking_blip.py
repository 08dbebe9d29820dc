"""A tracking server's blip: the real `mlflow server` stops, and starts again on the same port
and store while trainflow still works.

- The final training's epoch rows (``training.loop.progress``'s checkpointed epochs, the train
  stage's sink) reach the run each exactly once.
- A stage whose MLflow call fails because the server is gone waits for it
  (``training.stages.blips``) and asks Prefect to run it again once it answers.
- Both outages are in the run's record (``training.tracking.outage_record``), written on the
  parent run once the server answers: the ``outages.json`` table and the count tag.

The whole pipeline was tried the same way by hand (the server down 40 s during training of
a smoke run): it exits 0 with every epoch once and the champion registered."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow_servers import mlflow_server

from training.config import MlflowConfig, PipelineConfig
from training.errors import TrackingBlipError, is_retriable
from training.loop.progress import _CheckpointedEpochs
from training.platform.cluster import free_port
from training.stages.blips import tracking_blips
from training.tracking import outage_record
from training.tracking.runs import Tracker
from training.tracking.store import HTTP_ENV_DEFAULTS

pytestmark = pytest.mark.integration


def _row(epoch: int) -> dict:
    return {"epoch": epoch, "val_accuracy": 0.5 + epoch / 100, "train_loss": 1.0 / epoch}


class ServerLater(threading.Thread):
    """The server started again (as `trainflow up` would) a few seconds from now, and kept
    running until ``stop``."""

    def __init__(self, home, port: int) -> None:
        super().__init__(daemon=True)
        self.home, self.port = home, port
        self.up, self._stop_it = threading.Event(), threading.Event()

    def run(self) -> None:
        self._stop_it.wait(8)  # after the stage's call has failed (2 retries, ~6 s)
        with mlflow_server(self.home, self.home / "server-2.log", port=self.port):
            self.up.set()
            self._stop_it.wait()

    def stop(self) -> None:
        self._stop_it.set()
        self.join(timeout=60)


def test_a_blip_loses_no_epoch_and_the_stage_that_met_it_runs_again(tmp_path, monkeypatch, caplog):
    for key, value in HTTP_ENV_DEFAULTS.items():  # as a run sets them: a dead server fails fast
        monkeypatch.setenv(key, value)
    outage_record.reset()
    port = free_port()
    with mlflow_server(tmp_path, tmp_path / "server-1.log", port=port) as url:
        client = MlflowClient(url)
        experiment = client.create_experiment("blip")
        run = client.create_run(experiment).info.run_id
        tracker = Tracker(client, url, experiment, config=None)
        sink = outage_record.watched(tracker.history_sink(run), url, "the epoch rows")
        # Each checkpoint tries again here (by default the next waits RETRY_AFTER_S after a
        # failure: tests/unit/test_live_epochs.py).
        epochs = _CheckpointedEpochs(sink, retry_after_s=0)
        epochs.add(_row(1), checkpointed=True)
    # The server is gone: epoch 2 is checkpointed but cannot be sent, epoch 3 waits for a
    # checkpoint. Neither raises into the training.
    with caplog.at_level(logging.WARNING, logger="training.loop.progress"):
        epochs.add(_row(2), checkpointed=True)
        epochs.add(_row(3), checkpointed=False)
    assert "epoch metrics not logged yet" in caplog.text
    # A stage's own call meets the dead server: it waits until the server answers again.
    config = PipelineConfig(mlflow=MlflowConfig(tracking_uri=url, outage_grace_s=300))
    later = ServerLater(tmp_path, port)
    later.start()
    try:
        with pytest.raises(TrackingBlipError) as raised, tracking_blips(config, "evaluate"):
            client.log_metric(run, "test_accuracy", 0.9)
        assert is_retriable(raised.value) and "answers again after" in str(raised.value)
        assert later.up.wait(60)  # the server this wait saw answer is the one started again
        epochs.add(_row(4), checkpointed=True)
        for key in ("val_accuracy", "train_loss"):
            history = client.get_metric_history(run, key)
            assert sorted(m.step for m in history) == [1, 2, 3, 4], key
        values = {m.step: m.value for m in client.get_metric_history(run, "val_accuracy")}
        assert values == {e: _row(e)["val_accuracy"] for e in (1, 2, 3, 4)}
        _check_the_record(client, run, url, tmp_path)
    finally:
        later.stop()


def _check_the_record(client: MlflowClient, run: str, url: str, tmp_path) -> None:
    """The stage's wait and the epoch rows' outage, each a row on the (parent) run."""
    stage, rows = outage_record.recorded()
    assert stage.waited == "the evaluate stage" and stage.seconds >= 5
    assert rows.waited == "the epoch rows (epochs 2-4)"
    assert rows.started < stage.ended <= rows.ended  # UTC ISO: ordered as text
    assert outage_record.write(client, run) == 2
    assert client.get_run(run).data.tags[outage_record.COUNT_TAG] == "2"
    table = json.loads(
        Path(client.download_artifacts(run, outage_record.TABLE, str(tmp_path))).read_text()
    )
    assert table["columns"] == ["what", "started", "ended", "seconds", "waited"]
    assert [row[4] for row in table["data"]] == [stage.waited, rows.waited]
    assert all(row[0] == f"MLflow at {url}" for row in table["data"])
