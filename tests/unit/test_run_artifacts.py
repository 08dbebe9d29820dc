"""MLflow's Source / Created by for a pipeline run."""

from __future__ import annotations

import getpass

from flows import run_artifacts


def test_a_cli_run_is_sourced_to_trainflow_run_and_its_user():
    tags = run_artifacts.source_tags()
    assert tags == {
        "mlflow.source.name": "trainflow run",
        "mlflow.source.type": "LOCAL",
        "mlflow.user": getpass.getuser(),
    }


def test_a_deployment_run_is_sourced_to_its_deployment(monkeypatch):
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__NAME", "nightly")
    tags = run_artifacts.source_tags()
    assert tags["mlflow.source.name"] == "deployment pipeline/nightly"
    assert tags["mlflow.source.type"] == "JOB"
