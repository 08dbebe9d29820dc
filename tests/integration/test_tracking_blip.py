"""A tracking server's blip while training: the real `mlflow server` stops and starts again on
the same port and store, and the final training's epoch rows (``training.loop.progress``'s
checkpointed epochs, the train stage's sink) reach the run each exactly once.

The whole pipeline was tried the same way by hand (the server down 40 s during training of
a smoke run): it exits 0 with every epoch once and the champion registered."""

from __future__ import annotations

import logging

import pytest
from mlflow import MlflowClient
from mlflow_servers import mlflow_server

from training.loop.progress import _CheckpointedEpochs
from training.platform.cluster import free_port
from training.tracking.runs import Tracker
from training.tracking.store import HTTP_ENV_DEFAULTS

pytestmark = pytest.mark.integration


def _row(epoch: int) -> dict:
    return {"epoch": epoch, "val_accuracy": 0.5 + epoch / 100, "train_loss": 1.0 / epoch}


def test_epochs_sent_during_an_outage_arrive_once_when_the_server_is_back(
    tmp_path, monkeypatch, caplog
):
    for key, value in HTTP_ENV_DEFAULTS.items():  # as a run sets them: a dead server fails fast
        monkeypatch.setenv(key, value)
    port = free_port()
    with mlflow_server(tmp_path, tmp_path / "server-1.log", port=port) as url:
        client = MlflowClient(url)
        experiment = client.create_experiment("blip")
        run = client.create_run(experiment).info.run_id
        epochs = _CheckpointedEpochs(
            Tracker(client, url, experiment, config=None).history_sink(run)
        )
        epochs.add(_row(1), checkpointed=True)
    # The server is gone: epoch 2 is checkpointed but cannot be sent, epoch 3 waits for a
    # checkpoint. Neither raises into the training.
    with caplog.at_level(logging.WARNING, logger="training.loop.progress"):
        epochs.add(_row(2), checkpointed=True)
        epochs.add(_row(3), checkpointed=False)
    assert "epoch metrics not logged yet" in caplog.text
    with mlflow_server(tmp_path, tmp_path / "server-2.log", port=port):
        epochs.add(_row(4), checkpointed=True)
        for key in ("val_accuracy", "train_loss"):
            history = client.get_metric_history(run, key)
            assert sorted(m.step for m in history) == [1, 2, 3, 4], key
        values = {m.step: m.value for m in client.get_metric_history(run, "val_accuracy")}
        assert values == {e: _row(e)["val_accuracy"] for e in (1, 2, 3, 4)}
