"""The logged model carries its evidence (a real sqlite MLflow store): the
test metrics linked to the evaluate run and the test split's dataset, the train run's metrics
at the checkpoint's epoch linked to the training and validation splits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from model_states import raw_rows, trainflow_state

from training.config import MlflowConfig, PipelineConfig

SOURCE = "builtin:iris"
FINGERPRINT = "f00dfeed"


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A pipeline's train run (2 epochs), evaluate run, and the model logged from the train run,
    its evidence linked with the checkpoint from epoch 1."""
    import torch

    from training.tracking.flavour import log_model
    from training.tracking.model_evidence import link_evidence
    from training.tracking.store import configure

    home = tmp_path_factory.mktemp("evidence-home")
    config = PipelineConfig(
        mlflow=MlflowConfig(
            experiment="evidence",
            registered_model="evidence-model",
            tracking_uri=f"sqlite:///{home / 'mlflow.db'}",
        )
    )
    tracker = configure(config)
    parent = tracker.start_parent_run("evidence", {})
    train = tracker.start_child_run(parent, "train", "train")
    history = [
        {"epoch": 1, "train_loss": 0.9, "val_loss": 0.8, "val_accuracy": 0.7, "lr": 0.01},
        {"epoch": 2, "train_loss": 0.5, "val_loss": 0.85, "val_accuracy": 0.6, "lr": 0.005},
    ]
    tracker.log_history(train, history)
    evaluate = tracker.start_child_run(parent, "evaluate", "evaluate")
    tracker.log_metrics(evaluate, {"test_accuracy": 0.75, "f1_score": 0.74})
    tracker.end_run(evaluate)
    torch.save(trainflow_state(), home / "state.pt")
    version = log_model(tracker, train, str(home / "state.pt"), raw_rows(), "evidence")
    manifest = SimpleNamespace(source=SOURCE, fingerprint=FINGERPRINT)
    link_evidence(tracker, version.model_id, manifest, train, 1, evaluate)
    link_evidence(tracker, version.model_id, manifest, train, 1, evaluate)  # a retried promote
    return {"tracker": tracker, "version": version, "train": train, "evaluate": evaluate}


def _model_metrics(logged) -> dict[str, tuple]:
    model = logged["tracker"].client.get_logged_model(logged["version"].model_id)
    return {
        m.key: (m.value, m.step, m.dataset_name, m.dataset_digest, m.run_id) for m in model.metrics
    }


def test_the_model_holds_its_test_and_training_metrics_by_dataset(logged):
    train, evaluate = logged["train"], logged["evaluate"]
    model = logged["tracker"].client.get_logged_model(logged["version"].model_id)
    assert len(model.metrics) == 5  # once each, though linked twice
    assert _model_metrics(logged) == {
        "test_accuracy": (0.75, 0, f"{SOURCE} [test]", FINGERPRINT, evaluate),
        "f1_score": (0.74, 0, f"{SOURCE} [test]", FINGERPRINT, evaluate),
        # the checkpoint's epoch, not the last one; lr is no evidence about the model
        "train_loss": (0.9, 1, f"{SOURCE} [train]", FINGERPRINT, train),
        "val_loss": (0.8, 1, f"{SOURCE} [val]", FINGERPRINT, train),
        "val_accuracy": (0.7, 1, f"{SOURCE} [val]", FINGERPRINT, train),
    }


def test_the_runs_histories_are_unchanged_and_evaluate_takes_the_model(logged):
    client = logged["tracker"].client
    history = client.get_metric_history(logged["train"], "val_accuracy")
    assert [(m.step, m.value) for m in history] == [(1, 0.7), (2, 0.6)]
    assert [m.value for m in client.get_metric_history(logged["evaluate"], "test_accuracy")] == [
        0.75
    ]
    inputs = client.get_run(logged["evaluate"]).inputs.model_inputs
    assert [m.model_id for m in inputs] == [logged["version"].model_id]


def test_the_model_is_named_after_the_registered_model_and_described(logged):
    from training.tracking.model_evidence import describe

    tracker, model_id = logged["tracker"], logged["version"].model_id
    describe(tracker, model_id, "chosen as ...\n\n- [train run](http://x/#/runs/1)")
    model = tracker.client.get_logged_model(model_id)
    assert model.name == "evidence-model"
    assert model.source_run_id == logged["train"]
    assert model.tags["mlflow.note.content"].endswith("[train run](http://x/#/runs/1)")
