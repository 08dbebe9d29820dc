"""A real table as users hold it, end to end: one smoke-size `trainflow run` on the
Palmer penguins (text categories, 19 empty cells) with no flag, then `trainflow predict` on the
raw table as a CSV, gaps and an island never seen in training included. One pipeline run for the
whole module: CI time is short."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_runner import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PENGUINS = str(REPO_ROOT / "configs" / "penguins.yaml")
MODEL = "penguins-smoke"
# configs/penguins.yaml at the sizes of configs/smoke.yaml.
SMOKE_SIZES = {
    "train.max_epochs": 3,
    "train.num_workers": 2,
    "sweep.num_samples": 4,
    "sweep.max_concurrent_trials": 2,
    "sweep.asha.max_t": 3,
    "sweep.asha.grace_period": 1,
    "sweep.asha.reduction_factor": 2,
    "mlflow.experiment": "trainflow-smoke",
    "mlflow.registered_model": MODEL,
}
SETS = [arg for key, value in SMOKE_SIZES.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("penguins-home")


@pytest.fixture(scope="module")
def run(home):
    out = home / "summary.json"
    proc = run_cli(home, "run", "--config", PENGUINS, *SETS, "--summary-json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


def test_the_table_trains_as_it_is_and_every_role_is_on_the_console(run):
    summary, proc = run
    assert sum(summary["data"]["rows"].values()) == 344
    assert (
        "columns: 5 numeric (bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g, "
        "year), 2 categorical (island, sex);" in proc.stdout
    )
    assert summary["test_metrics"]["test_accuracy"] > 0.8


def test_the_run_records_the_roles(home, run):
    from mlflow import MlflowClient

    summary, _ = run
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    tags = client.get_run(summary["mlflow"]["parent_run_id"]).data.tags
    assert tags["trainflow.column.island"] == "categorical"
    assert tags["trainflow.column.body_mass_g"] == "numeric"


def test_predict_takes_the_raw_table_with_gaps_and_an_unseen_island(home, run):
    from palmerpenguins import load_penguins

    rows = load_penguins().drop(columns=["species"])
    rows.loc[0, "island"] = "Atlantis"
    assert rows.isna().any(axis=1).sum() > 0
    source, out = home / "new-penguins.csv", home / "predictions.parquet"
    rows.to_csv(source, index=False)
    proc = run_cli(
        home, "predict", "-m", f"models:/{MODEL}@champion", "-i", str(source), "-o", str(out)
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # The console holds the one line (the console wraps it at its width).
    assert " ".join(proc.stdout.split()) == f"wrote 344 predictions to {out}"
    # Ray Data's and MLflow's lines went to the command's log file, not the console.
    assert proc.stderr.strip() == "", proc.stderr[-2000:]
    predicted = pd.read_parquet(out)
    assert len(predicted) == 344
    assert set(predicted["prediction"]) <= {"Adelie", "Chinstrap", "Gentoo"}
