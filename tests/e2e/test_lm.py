"""A causal language model end to end: one `trainflow run` with ``data.task:
causal_lm`` on a small table of real BBC News texts, a tiny GPT-2 saved with
``save_pretrained`` to a temporary directory and loaded by path, a tokenizer fitted on the
training split, texts packed into blocks, 2 CPU workers and a 2-trial sweep ranked by val_loss.
The run's checks: perplexity logged and finite, samples logged, the model registered, and the
champion generating text from a prompt with inference params, in-process and through a real
`mlflow models serve` (``/invocations`` with ``params``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_runner import run_cli
from hf_tables import bbc_table

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "bbc-lm-e2e"
TINY_GPT2 = {"vocab_size": 400, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    home = tmp_path_factory.mktemp("lm-home")
    bbc_table(per_topic=30).to_parquet(home / "bbc.parquet")
    GPT2LMHeadModel(GPT2Config(**TINY_GPT2)).save_pretrained(home / "tiny-gpt2")
    config = {
        "data": {
            "source": str(home / "bbc.parquet"),
            "label_column": "topic",
            "task": "causal_lm",
            "max_length": 32,
            "columns": {"words": "ignore"},
        },
        "model": {
            "kind": "hf",
            "hf": {"name_or_path": str(home / "tiny-gpt2"), "tokenizer": "train"},
        },
        "train": {
            "max_epochs": 3,
            "num_workers": 2,
            "batch_size": 16,
            "lr": 0.01,
            "grad_accum_steps": 2,
        },
        "sweep": {
            "num_samples": 2,
            "max_concurrent_trials": 2,
            "asha": {"max_t": 2, "grace_period": 1, "reduction_factor": 2},
            "search_space": {"train.lr": {"loguniform": [5.0e-3, 2.0e-2]}},
        },
        "mlflow": {"experiment": "lm-e2e", "registered_model": MODEL},
    }
    (home / "lm.yaml").write_text(yaml.safe_dump(config))
    return home


@pytest.fixture(scope="module")
def run(home):
    out = home / "summary.json"
    proc = run_cli(
        home, "run", "--config", str(home / "lm.yaml"), "--summary-json", str(out), timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


def test_the_texts_are_packed_and_the_label_is_said_not_used(home, run):
    summary, proc = run
    assert "'topic' not used: not used by data.task=causal_lm" in proc.stdout
    log = next(home.glob("logs/run-*.log")).read_text()
    assert "packed into blocks of 32 tokens" in log
    # 90 texts of ~100 tokens each: several blocks of 32 per text.
    assert sum(summary["data"]["rows"].values()) > 2 * 90


def test_perplexity_is_logged_finite_and_the_model_registered(run):
    import torch

    summary, _ = run
    metrics = summary["test_metrics"]
    assert math.isfinite(metrics["test_perplexity"]) and metrics["test_perplexity"] > 1
    assert metrics["test_perplexity"] == pytest.approx(math.exp(metrics["test_loss"]), rel=1e-6)
    state = torch.load(Path(summary["checkpoint"]) / "state.pt", weights_only=True)
    history = state["history"]
    assert all(math.isfinite(e["val_perplexity"]) for e in history)
    assert history[-1]["val_loss"] < history[0]["val_loss"], history
    assert set(summary["sweep"]["best_params"]) == {"train.lr"}
    assert summary["model"]["version"]


def test_the_samples_table_is_logged(home, run):
    table = json.loads(next(home.glob("mlartifacts/**/samples.json")).read_text())
    assert table["columns"] == ["prompt", "reference", "generation"]
    assert len(table["data"]) == 5


def test_the_champion_generates_from_a_prompt_with_params(home, run):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    champion = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    params = champion.metadata.get_params_schema().to_dict()
    assert {p["name"] for p in params} == {"max_new_tokens", "temperature", "top_p"}
    prompts = pd.DataFrame({"prompt": ["the bank said profits", "the match ended"]})
    greedy = {"max_new_tokens": 6, "temperature": 0.0}
    first = champion.predict(prompts, params=greedy)
    assert list(first.columns) == ["generated_text"] and len(first) == 2
    assert all(isinstance(t, str) and t for t in first["generated_text"])
    assert first.equals(champion.predict(prompts, params=greedy))  # greedy: deterministic
    sampled = champion.predict(prompts, params={"max_new_tokens": 4, "temperature": 1.0})
    assert len(sampled) == 2


def test_mlflow_models_serve_generates_with_params(home, run):
    import mlflow.pyfunc
    from champion_checks import Served
    from cli_runner import free_port

    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    champion = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    prompts = pd.DataFrame({"prompt": ["the bank said profits", "the match ended"]})
    greedy = {"max_new_tokens": 5, "temperature": 0.0}
    expected = champion.predict(prompts, params=greedy)["generated_text"].tolist()
    served = Served(uri, f"models:/{MODEL}@champion", free_port(), home / "serve.log")
    request = {"dataframe_records": prompts.to_dict(orient="records"), "params": greedy}
    try:
        served.wait_ready()
        status, body = served.invoke(request)
        assert status == 200, body
        got = [row["generated_text"] for row in body["predictions"]]
        assert got == expected  # temperature 0: the served model decodes as the loaded one
        assert served.invoke(request)[1] == body  # and again: deterministic
        status, body = served.invoke({**request, "params": {"max_new_tokens": 0}})
        assert status == 400 and "max_new_tokens=0" in json.dumps(body), body
    finally:
        served.stop()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("train.strategy=deepspeed", "pip install -e '.[deepspeed]'"),
        ("data.max_length=512", "data.max_length=512 is more than the model's 128"),
    ],
)
def test_bad_language_model_configs_are_refused_before_anything_starts(tmp_path, setting, message):
    home = tmp_path / "refused"
    config = str(Path(__file__).resolve().parents[2] / "configs" / "lm.yaml")
    proc = run_cli(home, "run", "--config", config, "--set", setting)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert message in text and "Traceback" not in text
    assert not [p for p in ("ray", "prefect", "mlflow.db", "storage") if (home / p).exists()]


def _tokenizer_without_a_chat_template(directory: Path) -> Path:
    from transformers import PreTrainedTokenizerFast

    from training.data.text_spec import fit_wordpiece

    backend = fit_wordpiece(["the bank said profits rose", "the match ended"] * 20, 100)
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]").save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["data.chat_template=true"], "model.hf.tokenizer: train fits a tokenizer that has none"),
        (["data.response_column=null"], "set both data.prompt_column and data.response_column"),
        (["data.chat_template=true", "model.hf.tokenizer=TOKENIZER"], "has no chat template"),
    ],
)
def test_bad_prompt_response_configs_are_refused_before_anything_starts(
    tmp_path, settings, message
):
    home = tmp_path / "refused"
    tokenizer = _tokenizer_without_a_chat_template(tmp_path / "tokenizer")
    config = str(Path(__file__).resolve().parents[2] / "configs" / "lm-prompts.yaml")
    sets = [a for s in settings for a in ("--set", s.replace("TOKENIZER", str(tokenizer)))]
    proc = run_cli(home, "run", "--config", config, *sets)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert message in text and "Traceback" not in text
    assert not [p for p in ("ray", "prefect", "mlflow.db", "storage") if (home / p).exists()]
