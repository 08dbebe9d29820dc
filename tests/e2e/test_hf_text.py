"""A Hugging Face text model end to end: one `trainflow run` with ``model.kind: hf``
on a small table of real BBC News texts (and a numeric column the model does not read), a tiny
BERT saved with ``save_pretrained`` to a temporary directory and loaded by path (the real
loading code), a tokenizer fitted on the training split, LoRA, FSDP over 2 CPU workers and a
2-trial sweep of the learning rate and the LoRA rank. One pipeline run shared by the module's
checks: trained, registered merged, predicting raw text in-process, in a Python without
trainflow, and through `mlflow models serve`. Then bad input refused before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_runner import run_cli
from hf_tables import TOPICS, bbc_table, save_tiny_bert

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "bbc-hf-e2e"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    bbc_table(per_topic=50).to_parquet(home / "bbc.parquet")
    save_tiny_bert(home / "tiny-bert")
    config = {
        "data": {"source": str(home / "bbc.parquet"), "label_column": "topic", "max_length": 48},
        "model": {
            "kind": "hf",
            "hf": {
                "name_or_path": str(home / "tiny-bert"),
                "tokenizer": "train",
                "lora": {"r": 4, "alpha": 8.0},
            },
        },
        "train": {"max_epochs": 3, "num_workers": 2, "batch_size": 16, "lr": 0.02},
        "sweep": {
            "num_samples": 2,
            "max_concurrent_trials": 2,
            "asha": {"max_t": 3, "grace_period": 1, "reduction_factor": 2},
            "search_space": {
                "train.lr": {"loguniform": [1.0e-2, 3.0e-2]},
                "model.hf.lora.r": {"choice": [2, 4]},
            },
        },
        "mlflow": {"experiment": "hf-e2e", "registered_model": MODEL},
    }
    (home / "text.yaml").write_text(yaml.safe_dump(config))
    return home


@pytest.fixture(scope="module")
def run(home):
    out = home / "summary.json"
    proc = run_cli(
        home,
        "run",
        "--config",
        str(home / "text.yaml"),
        "--set",
        "train.strategy=fsdp",
        "--summary-json",
        str(out),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


@pytest.fixture(scope="module")
def champion(home, run):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    return mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")


def test_the_text_column_is_tokenized_and_the_other_is_named_not_used(run):
    summary, proc = run
    assert sum(summary["data"]["rows"].values()) == 150
    assert "columns: text 'body' as tokens" in proc.stdout
    assert "'words' not used: not used by model.kind=hf" in proc.stdout


def test_the_model_trained_swept_and_registered(run):
    import torch

    summary, _ = run
    state = torch.load(Path(summary["checkpoint"]) / "state.pt", weights_only=True)
    losses = [epoch["train_loss"] for epoch in state["history"]]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    assert any("lora_A" in key for key in state["model"])  # the adapter trained
    assert state["model_config"]["hf"]["name_or_path"] is None  # resolved: no download later
    trials = summary["sweep"]["trials"]
    assert len(trials) == 2 and all(t["status"] in ("completed", "stopped-early") for t in trials)
    assert set(summary["sweep"]["best_params"]) == {"train.lr", "model.hf.lora.r"}
    assert summary["model"]["version"] and summary["test_metrics"]["test_rows"] > 0


def test_the_registered_model_is_merged_and_needs_transformers(home, champion):
    import torch

    python_model = champion.unwrap_python_model()
    assert not [n for n, _ in python_model.network.named_parameters() if "lora" in n]
    requirements = next(home.glob("mlartifacts/**/requirements.txt")).read_text()
    assert "transformers==" in requirements and "tokenizers==" in requirements
    state = torch.load(next(home.glob("mlartifacts/**/artifacts/state.pt")), weights_only=True)
    assert state["model_config"]["hf"]["lora"] is None and "optimizer" not in state


def test_the_champion_predicts_raw_text_in_process(champion):
    texts = bbc_table(per_topic=60).tail(6)
    out = champion.predict(texts[["body"]])
    assert list(out.columns) == ["prediction", *TOPICS]
    assert set(out["prediction"]) <= set(TOPICS)
    assert out[list(TOPICS)].sum(axis=1).to_numpy() == pytest.approx(1.0)


def test_the_champion_loads_where_trainflow_is_not_installed(home, champion):
    from champion_checks import predict_without_trainflow

    table = home / "texts.parquet"
    bbc_table(per_topic=55).tail(5)[["body"]].to_parquet(table)
    uri = f"sqlite:///{home / 'mlflow.db'}"
    result = predict_without_trainflow(uri, f"models:/{MODEL}@champion", table, home / "out.pq")
    assert result == {"rows": 5, "columns": ["prediction", *TOPICS]}
    alone = pd.read_parquet(home / "out.pq")
    here = champion.predict(pd.read_parquet(table))
    assert alone["prediction"].tolist() == here["prediction"].tolist()


def test_mlflow_models_serve_answers_a_text_request(home, champion):
    from champion_checks import Served
    from cli_runner import free_port

    uri = f"sqlite:///{home / 'mlflow.db'}"
    news = ["Shares rose as the bank beat profit forecasts.", "A late goal won the cup tie."]
    texts = pd.DataFrame({"body": news})
    expected = champion.predict(texts)
    served = Served(uri, f"models:/{MODEL}@champion", free_port(), home / "serve.log")
    try:
        served.wait_ready()
        status, body = served.invoke({"dataframe_records": texts.to_dict(orient="records")})
        assert status == 200, body
        got = pd.DataFrame(body["predictions"])
        assert got["prediction"].tolist() == expected["prediction"].tolist()
        assert got["sports"].to_numpy() == pytest.approx(expected["sports"].to_numpy(), abs=1e-5)
        status, body = served.invoke({"dataframe_records": [{"body": 12}]})
        assert status == 400, body
    finally:
        served.stop()


def test_a_hub_id_that_needs_the_network_is_refused_before_anything_starts(tmp_path):
    home = tmp_path / "offline"
    proc = run_cli(
        home,
        "run",
        "--set",
        "model.kind=hf",
        "--set",
        "model.hf.name_or_path=no-such-org/tiny-bert-xyz",
        HF_HUB_OFFLINE="1",
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert "model.hf.name_or_path='no-such-org/tiny-bert-xyz'" in text
    assert "needs the network" in text and "Traceback" not in text
    assert not [p for p in ("ray", "prefect", "mlflow.db", "storage") if (home / p).exists()]
