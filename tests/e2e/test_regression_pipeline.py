"""Regression end to end: one smoke-size `trainflow run` on builtin:diabetes,
read back from MLflow, the registry and the report; then the champion evaluated on a CSV copy
of the same table (a CSV with a float label: preprocessing chooses regression again and the same
test rows give the same RMSE). One pipeline run for the whole module: CI time is short."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_runner import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
MODEL = "diabetes-smoke"
SETS = ["--set", "data.source=builtin:diabetes", "--set", f"mlflow.registered_model={MODEL}"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("regression-home")


@pytest.fixture(scope="module")
def run(home):
    out = home / "summary.json"
    proc = run_cli(home, "run", "--config", SMOKE, *SETS, "--summary-json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


@pytest.fixture(scope="module")
def client(home, run):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


@pytest.fixture(scope="module")
def stages(client, run):
    summary, _ = run
    children = client.search_runs(
        [summary["mlflow"]["experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{summary['mlflow']['parent_run_id']}'",
    )
    return {r.data.tags.get("trainflow.stage"): r for r in children}


@pytest.fixture(scope="module")
def champion(client, run):
    return client.get_model_version_by_alias(MODEL, "champion")


def test_the_run_is_a_regression_and_says_so(run):
    summary, proc = run
    assert sum(summary["data"]["rows"].values()) == 442
    metrics = summary["test_metrics"]
    assert set(metrics) == {"test_rmse", "test_mae", "test_r2", "test_loss", "test_rows"}
    assert metrics["test_rows"] == summary["data"]["rows"]["test"]
    # 3 epochs at smoke size: well short of the demo's figure, but clearly learnt (R² 0 = mean)
    assert metrics["test_r2"] > 0.2 and 0 < metrics["test_mae"] < metrics["test_rmse"] < 80
    assert summary["sweep"]["metric"] == "val_rmse"
    assert summary["model"]["decision"] == "first-model"
    assert summary["model"]["challenger_value"] == pytest.approx(metrics["test_rmse"])
    assert "task: regression (auto: float label 'label' with 214 distinct values)" in proc.stdout
    assert "test RMSE" in proc.stdout and "test_rmse" in proc.stdout
    assert summary["report"] and summary["report"].endswith("report.html")


def test_mlflow_has_the_task_the_regression_metrics_and_plots(client, run, stages):
    summary, _ = run
    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    assert parent.data.tags["trainflow.task"] == "regression"
    assert "float label" in parent.data.tags["trainflow.task_reason"]
    assert parent.data.params["data.task"] == "auto"  # the config as given
    train = stages["train"]
    assert train.data.params["task"] == "regression"
    for metric in ("val_rmse", "val_mae", "val_r2", "val_loss"):
        history = client.get_metric_history(train.info.run_id, metric)
        assert sorted(m.step for m in history) == [1, 2, 3], metric
    assert "val_accuracy" not in train.data.metrics
    trials = client.search_runs(
        [summary["mlflow"]["experiment_id"]],
        filter_string=f"tags.mlflow.parentRunId = '{stages['sweep'].info.run_id}'",
    )
    assert len(trials) == 4 and all("val_rmse" in t.data.metrics for t in trials)

    evaluate = stages["evaluate"].data.metrics
    assert evaluate["test_rmse"] == pytest.approx(summary["test_metrics"]["test_rmse"])
    # MLflow's own regressor evaluation of the same predictions, without a second copy of ours
    # (its rmse, mae and r2 are test_rmse, test_mae, test_r2)
    assert "max_error" in evaluate and "mean_squared_error" in evaluate, sorted(evaluate)
    duplicates = {"root_mean_squared_error", "mean_absolute_error", "r2_score"}
    assert not duplicates & set(evaluate), sorted(evaluate)
    artifacts = {a.path for a in client.list_artifacts(stages["evaluate"].info.run_id, "plots")}
    assert {"plots/predicted_vs_actual.png", "plots/residuals.png"} <= artifacts
    assert "plots/confusion_matrix.png" not in artifacts
    report = client.download_artifacts(parent.info.run_id, "report.html")
    html = Path(report).read_text()
    assert "predicted vs actual" in html and "residuals" in html
    assert "confusion matrix" not in html


def test_champion_is_gated_on_rmse_and_predicts_numbers(home, client, champion):
    import mlflow.pyfunc
    from champion_checks import raw_test_rows

    assert champion.tags["gate.metric"] == "test_rmse"
    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    rows = raw_test_rows(home / "datasets" / "diabetes" / "diabetes.parquet")
    out = model.predict(rows.drop(columns=["label"]))
    assert list(out.columns) == ["prediction"] and out["prediction"].dtype == np.float64
    # in the label's unit (25..346), not the normalised one the network learnt
    assert 50 < out["prediction"].mean() < 250
    rmse = float(np.sqrt(np.mean((out["prediction"] - rows["label"]) ** 2)))
    assert rmse == pytest.approx(float(champion.tags["test_rmse"]), rel=1e-5)


def test_evaluate_on_a_csv_with_a_float_label(home, champion):
    """The champion on a CSV copy of the table: the float label column makes it a regression
    again, the row hash finds the same test rows, the RMSE is the registered one."""
    csv = home / "diabetes.csv"
    pd.read_parquet(home / "datasets" / "diabetes" / "diabetes.parquet").to_csv(csv, index=False)
    proc = run_cli(
        home,
        "evaluate",
        "--config",
        SMOKE,
        *SETS,
        "--set",
        f"data.source={csv}",
        "--model",
        f"models:/{MODEL}@champion",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"test_rmse\s*│\s*([0-9.]+)", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) == pytest.approx(float(champion.tags["test_rmse"]), abs=1e-4)
    assert "test_r2" in proc.stdout and "test_accuracy" not in proc.stdout
