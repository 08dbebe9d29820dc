"""What a finished pipeline run leaves for people beyond its markdown: in Prefect, a table of the
sweep's trials and links to the MLflow parent run and the model version; in MLflow, the parent
run's description linking its best trial, train and evaluate runs and the model version."""

from __future__ import annotations

import getpass
import os

from prefect import get_run_logger, runtime
from prefect.artifacts import create_link_artifact, create_table_artifact

from training.config import PipelineConfig
from training.report.markdown import parent_run_note, trials_table
from training.summary import RunSummary
from training.tracking import ui
from training.tracking.runs import Tracker


def source_tags() -> dict[str, str]:
    """MLflow's "Source" and "Created by": the deployment that ran the flow, else `trainflow
    run`, and the user it ran as."""
    deployment = runtime.deployment.name
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = os.environ.get("USER", "unknown")
    return {
        "mlflow.source.name": f"deployment pipeline/{deployment}"
        if deployment
        else "trainflow run",
        "mlflow.source.type": "JOB" if deployment else "LOCAL",
        "mlflow.user": user,
    }


def publish(config: PipelineConfig, tracker: Tracker, parent: str, summary: RunSummary) -> None:
    """The parent run's description, then the Prefect table and link artifacts. Best effort: a
    finished run's results (model version, gate) stand whatever happens here."""
    try:
        _publish(config, tracker, parent, summary)
    except Exception as exc:
        get_run_logger().warning(
            "the run's links were not published: %s: %s", type(exc).__name__, exc
        )


def _publish(config: PipelineConfig, tracker: Tracker, parent: str, summary: RunSummary) -> None:
    model = summary.model
    links = ui.run_tree_links(tracker, parent, model.name, model.version)
    tracker.set_tags(parent, {"mlflow.note.content": parent_run_note(summary, links)})
    start = "" if ui.run_url(tracker, parent) else f" (start the UI: `{ui.command(tracker)}`)"
    if summary.sweep is not None:
        create_table_artifact(
            trials_table(summary.sweep, config.sweep.asha),
            key="trainflow-trials",
            description=f"the sweep's trials of run {summary.run_id}, in trial order{start}",
        )
    create_link_artifact(
        ui.run_page_url(tracker, parent),
        link_text=f"MLflow run pipeline-{summary.run_id}",
        key="trainflow-mlflow-run",
        description=f"the pipeline run in the MLflow UI{start}",
    )
    create_link_artifact(
        ui.model_version_url(tracker, model.name, model.version),
        link_text=f"{model.name} version {model.version} ({model.decision})",
        key="trainflow-model-version",
        description=f"the registered model version in the MLflow UI{start}",
    )
