"""Free text end to end: one short `trainflow run` of
configs/news-hashed.yaml on the bundled BBC News articles (no sweep, few epochs: CI time is
short), then the champion scoring raw article text as MLflow loads it; and a text column of
numbers refused as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runner import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NEWS = str(REPO_ROOT / "configs" / "news-hashed.yaml")
MODEL = "news-smoke"
SHORT = {
    "sweep.enabled": "false",
    "train.max_epochs": 4,
    "train.num_workers": 1,
    "mlflow.experiment": "trainflow-smoke",
    "mlflow.registered_model": MODEL,
}
SETS = [arg for key, value in SHORT.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("news-home")


@pytest.fixture(scope="module")
def run(home):
    out = home / "summary.json"
    proc = run_cli(home, "run", "--config", NEWS, *SETS, "--summary-json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


def test_the_articles_train_on_their_text(run):
    summary, proc = run
    assert sum(summary["data"]["rows"].values()) == 2225
    assert "columns: 1 text (text);" in " ".join(proc.stdout.split())
    assert "not used" not in proc.stdout
    assert summary["test_metrics"]["test_accuracy"] > 0.6  # 5 topics: chance is about 0.23


def test_the_run_records_the_text_role_and_the_champion_reads_raw_text(home, run):
    import mlflow.pyfunc
    from mlflow import MlflowClient

    summary, _ = run
    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    tags = client.get_run(summary["mlflow"]["parent_run_id"]).data.tags
    assert tags["trainflow.column.text"] == "text"
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    rows = pd.DataFrame(
        {
            "text": [
                "Shares fell sharply as the central bank raised interest rates again.",
                "The striker scored twice as the champions won the league title.",
                None,
            ]
        }
    )
    predicted = model.predict(rows)
    assert len(predicted) == 3
    assert predicted["prediction"].tolist()[:2] == ["business", "sports"]


def test_a_text_column_of_numbers_is_one_line_exit_2(tmp_path):
    path = tmp_path / "reviews.parquet"
    table = pa.table({"review": [1.5, 2.5] * 20, "label": ["a", "b"] * 20})
    pq.write_table(table, path)
    proc = run_cli(
        tmp_path,
        "run",
        *("--set", f"data.source={path}", "--set", "data.columns.review=text"),
        *("--set", "sweep.enabled=false"),
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "column 'review' is declared text but holds double values" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
