"""Each kept checkpoint becomes a logged model (a real sqlite MLflow store): named after the
registered model with its epoch, an output of the train run at that step, the epoch's metrics
linked by dataset, its own weights; a retried task logs none twice; the registered version can
be the best one's logged model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from model_states import raw_rows, trainflow_state

from training.config import MlflowConfig, PipelineConfig
from training.tracking.checkpoint_models import by_epoch, model_name

SOURCE = "builtin:iris"
FINGERPRINT = "f00dfeed"
HISTORY = [
    {"epoch": 1, "train_loss": 0.9, "val_loss": 0.8, "val_accuracy": 0.5, "lr": 0.01},
    {"epoch": 2, "train_loss": 0.6, "val_loss": 0.6, "val_accuracy": 0.8, "lr": 0.005},
    {"epoch": 3, "train_loss": 0.4, "val_loss": 0.7, "val_accuracy": 0.7, "lr": 0.002},
]
# Ray Train's best_checkpoints: the two kept (num_to_keep 2, by val_accuracy), best first.
KEPT = [("/ckpt/epoch_2", HISTORY[1]), ("/ckpt/epoch_3", HISTORY[2])]


def test_checkpoints_go_by_epoch_and_one_without_an_epoch_is_left_out():
    kept = [("c", {"epoch": 3}), ("a", {"epoch": 1.0}), ("x", {"val_loss": 0.1})]
    assert by_epoch(kept, best="c") == [(1, "a"), (3, "c")]


def test_of_two_checkpoints_of_one_epoch_the_best_is_logged():
    kept = [("mid", {"epoch": 2}), ("end", {"epoch": 2}), ("e1", {"epoch": 1})]
    assert by_epoch(kept, best="end") == [(1, "e1"), (2, "end")]
    assert by_epoch(kept, best="e1") == [(1, "e1"), (2, "mid")]
    assert model_name("digits-smoke", 3) == "digits-smoke-epoch-3"


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    from training.tracking.checkpoint_models import log_checkpoint_models
    from training.tracking.store import configure

    home = tmp_path_factory.mktemp("checkpoint-models")
    config = PipelineConfig(
        mlflow=MlflowConfig(
            experiment="checkpoints",
            registered_model="ckpt-model",
            tracking_uri=f"sqlite:///{home / 'mlflow.db'}",
        )
    )
    tracker = configure(config)
    parent = tracker.start_parent_run("checkpoints", {})
    train = tracker.start_child_run(parent, "train", "train")
    tracker.log_params(train, {"train.lr": 0.01})
    tracker.log_history(train, HISTORY)
    states = {path: trainflow_state(seed=int(path[-1])) for path, _ in KEPT}
    loaded = []

    def load_state(path):
        loaded.append(path)
        return {**states[path], "optimizer": {"state": {}}}

    manifest = SimpleNamespace(source=SOURCE, fingerprint=FINGERPRINT)
    models = log_checkpoint_models(
        tracker, train, manifest, KEPT, load_state, raw_rows(), best="/ckpt/epoch_2"
    )
    again = log_checkpoint_models(tracker, train, manifest, KEPT, load_state, raw_rows())
    return SimpleNamespace(
        tracker=tracker, train=train, models=models, again=again, loaded=loaded, states=states
    )


def test_one_logged_model_per_kept_checkpoint_named_by_epoch(logged):
    from mlflow.entities import LoggedModelStatus

    client = logged.tracker.client
    assert [(m.epoch, m.checkpoint_path) for m in logged.models] == [
        (2, "/ckpt/epoch_2"),
        (3, "/ckpt/epoch_3"),
    ]
    experiment = client.get_run(logged.train).info.experiment_id
    found = client.search_logged_models(experiment_ids=[experiment])
    assert sorted(m.name for m in found) == ["ckpt-model-epoch-2", "ckpt-model-epoch-3"]
    for model in found:
        assert model.source_run_id == logged.train
        assert model.status == LoggedModelStatus.READY
        assert model.params == {"train.lr": "0.01"}


def test_a_retried_task_logs_no_checkpoint_twice(logged):
    assert [m.model_id for m in logged.again] == [m.model_id for m in logged.models]
    assert logged.loaded == ["/ckpt/epoch_2", "/ckpt/epoch_3"]  # each read once


def test_each_is_an_output_of_the_train_run_at_its_epoch(logged):
    outputs = logged.tracker.client.get_run(logged.train).outputs.model_outputs
    assert {(o.model_id, o.step) for o in outputs} == {(m.model_id, m.epoch) for m in logged.models}


def test_each_holds_its_epochs_metrics_by_dataset(logged):
    client = logged.tracker.client
    for model in logged.models:
        metrics = {m.key: m for m in client.get_logged_model(model.model_id).metrics}
        row = HISTORY[model.epoch - 1]
        assert sorted(metrics) == ["train_loss", "val_accuracy", "val_loss"]  # no lr
        for key, metric in metrics.items():
            assert (metric.value, metric.step, metric.run_id) == (
                row[key],
                model.epoch,
                logged.train,
            )
            split = "train" if key.startswith("train_") else "val"
            assert metric.dataset_name == f"{SOURCE} [{split}]"
            assert metric.dataset_digest == FINGERPRINT


def test_each_loads_as_its_own_checkpoint_without_the_optimizer(logged, tmp_path):
    import torch

    from training.tracking.flavour import state_file

    for model in logged.models:
        found = state_file(logged.tracker, model.model_uri, dst_path=str(tmp_path / model.model_id))
        state = torch.load(found, map_location="cpu", weights_only=True)
        assert "optimizer" not in state
        expected = logged.states[model.checkpoint_path]["model"]
        assert all(torch.equal(state["model"][k], v) for k, v in expected.items())


def test_the_registered_version_can_be_the_best_checkpoints_model(logged):
    from training.tracking.flavour import log_model

    best = logged.models[0]
    version = log_model(
        logged.tracker, logged.train, "unused", None, "best", logged_model_uri=best.model_uri
    )
    assert version.model_id == best.model_id
    registered = logged.tracker.client.get_model_version("ckpt-model", version.version)
    assert registered.source == best.model_uri
    experiment = logged.tracker.client.get_run(logged.train).info.experiment_id
    assert len(logged.tracker.client.search_logged_models(experiment_ids=[experiment])) == 2


def test_promote_registers_the_best_checkpoints_model_when_there_is_one():
    from training.loop.trainer import TrainOutcome
    from training.stages.promote import _checkpoint_model
    from training.stages.train import Trained

    outcome = TrainOutcome("/ckpt/epoch_2", {"epoch": 2}, HISTORY, "/run")
    models = {"/ckpt/epoch_2": "m-2", "/ckpt/epoch_3": "m-3"}
    assert _checkpoint_model(Trained(outcome, "run", models)) == "models:/m-2"
    assert _checkpoint_model(Trained(outcome, "run")) is None  # mlflow.log_checkpoints: false
    assert _checkpoint_model(Trained(None, "run")) is None
