"""``train.engine: hf_trainer`` end to end: one `trainflow run` whose final
training is a transformers Trainer in each of 2 CPU TorchTrainer workers, on the BBC texts and
the tiny BERT of test_hf_text.py (saved with ``save_pretrained``, loaded by path). The loop's
checks: trained, a metric point per epoch in MLflow under the loop's names, trainflow's
checkpoint, registered, and the champion predicting raw text in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli
from hf_tables import TOPICS, bbc_table, save_tiny_bert

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "bbc-hf-trainer-e2e"
EPOCHS = 3


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("hf-trainer-home")
    bbc_table(per_topic=50).to_parquet(home / "bbc.parquet")
    save_tiny_bert(home / "tiny-bert")
    config = {
        "data": {"source": str(home / "bbc.parquet"), "label_column": "topic", "max_length": 48},
        "model": {
            "kind": "hf",
            "hf": {"name_or_path": str(home / "tiny-bert"), "tokenizer": "train"},
        },
        "train": {
            "engine": "hf_trainer",
            "hf_args": {"max_grad_norm": 1.0, "adam_beta2": 0.99},
            "max_epochs": EPOCHS,
            "num_workers": 2,
            "batch_size": 16,
            "lr": 0.01,
        },
        "sweep": {"enabled": False},
        "mlflow": {"experiment": "hf-trainer-e2e", "registered_model": MODEL},
    }
    (home / "text.yaml").write_text(yaml.safe_dump(config))
    return home


@pytest.fixture(scope="module")
def run(home):
    out = home / "summary.json"
    proc = run_cli(
        home, "run", "--config", str(home / "text.yaml"), "--summary-json", str(out), timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


def test_the_trainer_left_trainflows_checkpoint(run):
    import torch

    summary, _ = run
    state = torch.load(Path(summary["checkpoint"]) / "state.pt", weights_only=True)
    assert state["engine"] == "hf_trainer"
    # The best epoch's checkpoint: the history up to it, one row per epoch, both workers.
    epochs = [row["epoch"] for row in state["history"]]
    assert epochs == list(range(1, state["epoch"] + 1)), epochs
    assert all(row["workers"] == 2.0 and row["val_accuracy"] >= 0 for row in state["history"])
    assert state["model_config"]["hf"]["name_or_path"] is None  # resolved: no download later
    assert any(key.startswith("model.bert.") for key in state["model"])  # the loop's network


def step(point) -> int:
    return point.step


def test_each_epoch_is_in_mlflow_under_the_loops_names(home, run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("hf-trainer-e2e")
    runs = client.search_runs([experiment.experiment_id])
    trained = [
        r for r in runs if "val_accuracy" in r.data.metrics and "train_loss" in r.data.metrics
    ]
    assert trained, [r.data.metrics for r in runs]
    for metric in ("train_loss", "val_loss", "val_accuracy"):
        points = client.get_metric_history(trained[0].info.run_id, metric)
        assert sorted(p.step for p in points) == list(range(1, EPOCHS + 1)), metric
    losses = sorted(client.get_metric_history(trained[0].info.run_id, "train_loss"), key=step)
    assert losses[-1].value < losses[0].value, [p.value for p in losses]  # it trained


def test_the_model_is_registered_and_predicts_raw_text(home, run):
    import mlflow.pyfunc

    summary, _ = run
    assert summary["model"]["version"] and summary["test_metrics"]["test_rows"] > 0
    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    champion = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    out = champion.predict(bbc_table(per_topic=60).tail(6)[["body"]])
    assert list(out.columns) == ["prediction", *TOPICS]
    assert set(out["prediction"]) <= set(TOPICS)
    assert out[list(TOPICS)].sum(axis=1).to_numpy() == pytest.approx(1.0)
