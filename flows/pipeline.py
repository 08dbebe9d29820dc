"""The pipeline flow: stage order, run naming, MLflow run tree, Prefect artifacts."""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.exceptions import ExternalSignal

from flows import champion_events, quiet_errors, run_artifacts
from tasks import stages
from training import progress
from training.config import PipelineConfig
from training.errors import TrackingUnavailableError
from training.platform import cluster, signals
from training.platform.secrets import redact
from training.report.html import report_html, report_plots
from training.report.markdown import report_markdown, summary_markdown
from training.stages import preprocess as preprocess_stage
from training.storage import StorageLayout, exists, join
from training.summary import DataSummary, MlflowSummary, RunSummary
from training.tracking import outage_record, store, ui
from training.tracking.runs import STAGE_TAG

STAGES = ("preprocess", "sweep", "train", "evaluate", "promote")


def default_run_id() -> str:
    """Deterministic per flow run: the Prefect flow-run id, shortened."""
    flow_run_id = runtime.flow_run.id
    return str(flow_run_id).replace("-", "")[:12] if flow_run_id else "local"


class StageClock:
    """Wall seconds per stage, for the summary and the benchmarks; a stage neither begins nor
    counts as done once the run got SIGINT/SIGTERM (``signals.stop_if_received``: the handler's
    exception alone can be lost, and the run would go on to register a model and exit 0)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        number = STAGES.index(name) + 1 if name in STAGES else 0
        where = {"index": number, "total": len(STAGES)}
        signals.stop_if_received()
        progress.report(name, f"[{number}/{len(STAGES)}] started", event="start", **where)
        start = time.perf_counter()
        yield
        signals.stop_if_received()
        self.seconds[name] = round(time.perf_counter() - start, 2)
        progress.report(
            name,
            f"[{number}/{len(STAGES)}] done in {self.seconds[name]:.1f} s",
            event="done",
            seconds=self.seconds[name],
            **where,
        )


@flow(name="pipeline", log_prints=True)
def pipeline(config: PipelineConfig | None = None, run_id: str | None = None) -> RunSummary:
    """Preprocess -> sweep -> train -> evaluate -> promote, each a retriable task."""
    quiet_errors.install()
    config = config or PipelineConfig()
    run_id = run_id or default_run_id()
    logger = get_run_logger()
    clock = StageClock()
    outages = _pending_outages(config, run_id)
    # Reach MLflow (a health check for servers) before Ray or any file is touched.
    tracker = store.configure(config)
    parent = tracker.start_parent_run(
        run_id,
        tags={"prefect.flow_run_id": str(runtime.flow_run.id or ""), **run_artifacts.source_tags()},
    )
    logger.info("run %s: MLflow parent run %s (%s)", run_id, parent, redact(tracker.tracking_uri))
    _write_outages(config, tracker, parent, outages)
    # A re-run of a killed run (SIGKILL: no handler ran) finds its runs still RUNNING: they
    # belong to a dead process. Stage runs are resumed by name; the trials Tune restarts get
    # new runs.
    stale = tracker.close_unfinished(parent, "KILLED", include_parent=False)
    if stale:
        logger.warning(
            "run %s: %d MLflow run(s) left RUNNING by a killed process marked KILLED",
            run_id,
            len(stale),
        )
    try:
        summary = _run_stages(config, run_id, parent, tracker, clock)
        signals.stop_if_received()  # one that came during the report: the run is not FINISHED
    except BaseException as exc:
        # No MLflow run may be left RUNNING: Ctrl-C/SIGTERM (Prefect's TerminationSignal) is
        # KILLED, anything else FAILED.
        interrupted = isinstance(exc, KeyboardInterrupt | SystemExit | ExternalSignal)
        interrupted = interrupted or signals.received() is not None
        _write_outages(config, tracker, parent, outages)
        _close_unfinished(tracker, parent, "KILLED" if interrupted else "FAILED")
        if isinstance(exc, TrackingUnavailableError):  # the stage did not know the run's id
            raise exc.naming(run_id) from None
        raise
    finally:
        cluster.shutdown()
    _write_outages(config, tracker, parent, outages)
    tracker.end_run(parent, "FINISHED")
    create_markdown_artifact(
        summary_markdown(summary), key="trainflow-summary", description=f"trainflow run {run_id}"
    )
    if summary.model.gate_record:  # the gate's decision record (docs/gate.md)
        create_table_artifact([summary.model.gate_record], key="gate-decision")
    return summary


def _close_unfinished(tracker, parent: str, status: str) -> None:
    """End the run's MLflow runs as a failed run leaves them. A server that does not answer
    (the run stops past ``mlflow.outage_grace_s``) cannot take it: the stop's own error goes
    on, and the resume marks the runs left RUNNING."""
    try:
        tracker.close_unfinished(parent, status)
    except Exception as exc:
        get_run_logger().warning("MLflow runs not marked %s: %s", status, exc)


def _pending_outages(config, run_id: str) -> str:
    """Where the run keeps the outages MLflow cannot take yet; the record starts with those a
    stopped run of the same id kept there (its resume writes them)."""
    pending = join(StorageLayout.from_config(config).runs_dir(run_id), "outages-pending.json")
    outage_record.reset()  # this run's only: a process may run the flow again
    try:
        outage_record.load_pending(pending, config.storage.endpoint_url)
    except Exception as exc:  # the earlier run's log has each outage's line
        get_run_logger().warning("the stopped run's tracking outages not read: %s", exc)
    return pending


def _write_outages(config, tracker, parent: str, pending: str) -> None:
    """The outages the run met, on its parent run; those the server cannot take yet (it is
    gone again, or for good: the run stops) are kept at ``pending`` for the resume."""
    try:
        outage_record.write(tracker.client, parent)
    except Exception as exc:
        get_run_logger().warning("the run's tracking outages not in MLflow yet: %s", exc)
    try:
        outage_record.keep_pending(pending, config.storage.endpoint_url)
    except Exception as exc:  # the log has each outage's line
        get_run_logger().warning("the run's tracking outages not kept for a resume: %s", exc)


def _preprocess(config, tracker, parent, layout: StorageLayout):
    """Inspect, preprocess (reused while its cached files exist), record: (manifest, cached,
    the config that follows the data's task, the drift from the champion's training data)."""
    data = stages.inspect_data(config)
    manifest_uri = join(layout.data_dir(data.fingerprint), "manifest.json")
    # A cached Prefect result is only good while its files exist.
    refresh = not exists(manifest_uri, config.storage.endpoint_url)
    state = stages.preprocess.with_options(refresh_cache=refresh or None)(
        config, data.fingerprint, data.files, return_state=True
    )
    manifest, cached = state.result(), state.name == "Cached"
    get_run_logger().info(
        "preprocess: %s (fingerprint %s, rows %s)",
        "reused cached output, nothing recomputed" if cached else "computed",
        data.fingerprint,
        manifest.rows,
    )
    prepared = preprocess_stage.record(config, tracker, parent, manifest, cached)
    return manifest, cached, prepared.config, prepared.drift


def _run_stages(config, run_id, parent, tracker, clock: StageClock) -> RunSummary:
    layout = StorageLayout.from_config(config)
    with clock.stage("preprocess"):
        manifest, cached, config, drift = _preprocess(config, tracker, parent, layout)

    best_config, sweep_outcome = config, None
    if config.sweep.enabled:
        with clock.stage("sweep"):
            sweep_outcome = stages.sweep(config, manifest, run_id, parent)
            best_config = config.with_overrides(sweep_outcome.best_params)
    with clock.stage("train"):
        trained = stages.train(best_config, manifest, run_id, parent)
    with clock.stage("evaluate"):
        evaluated = stages.evaluate(best_config, manifest, trained.outcome.checkpoint_path, parent)
    # Nothing after evaluation uses Ray: it stops while the model is promoted and reported.
    cluster.shutdown_soon()
    with clock.stage("promote"):
        model = stages.promote(
            best_config,
            manifest,
            trained,
            evaluated,
            parent,
            sweep_outcome,
            run_id=run_id,
            drift=drift,
        )
    # A Prefect event: the automation `trainflow notify` sets up sends the message.
    champion_events.champion_moved(model, best_config.mlflow.gate.metric, run_id)

    summary = RunSummary(
        run_id=run_id,
        data=DataSummary(
            source=manifest.source,
            fingerprint=manifest.fingerprint,
            rows=manifest.rows,
            preprocess_cached=cached,
        ),
        sweep=sweep_outcome,
        test_metrics=evaluated.result.metrics,
        mlflow=_mlflow_summary(config, tracker, parent, trained.run_id),
        model=model,
        checkpoint=trained.outcome.checkpoint_path,
        storage=layout.runs_dir(run_id),
        stage_seconds=clock.seconds,
        ray_dashboard=(
            trained.outcome.dashboard if trained.outcome.dashboard_outlives_run else None
        ),
        last_epoch=dict(trained.outcome.history[-1]) if trained.outcome.history else None,
        outages=[asdict(outage) for outage in outage_record.recorded()],
    )
    summary.report = _publish_report(
        config, tracker, parent, summary, trained.outcome.history, evaluated.result
    )
    tracker.log_dict(parent, summary.to_dict(), "summary.json")
    run_artifacts.publish(config, tracker, parent, summary)
    return summary


def _mlflow_summary(config, tracker, parent: str, train_run: str) -> MlflowSummary:
    return MlflowSummary(
        tracking_uri=redact(tracker.tracking_uri),
        experiment=config.mlflow.experiment,
        experiment_id=tracker.experiment_id,
        parent_run_id=parent,
        train_run_id=train_run,
        ui_command=ui.command(tracker),
        run_url=ui.run_page_url(tracker, parent),
    )


def _publish_report(
    config, tracker, parent, summary: RunSummary, train_history, eval_result
) -> str | None:
    """The run's HTML report: logged to the parent run as report.html and announced as a Prefect
    artifact; returns where to open it. A report that cannot be built is a warning: the run's
    results (model version, gate) stand."""
    logger = get_run_logger()
    try:
        runs = tracker.find_runs(parent)
        # Into the MLflow UI's training view (a local store's after `mlflow ui`, see ui.command).
        links = {"this run in the MLflow UI": ui.run_page_url(tracker, parent)}
        trials = [run.info.run_id for run in runs if run.data.tags.get(STAGE_TAG) == "trial"]
        if trials:
            links["the sweep's trials side by side"] = ui.compare_url(tracker, trials)
        with tempfile.TemporaryDirectory() as tmp:
            # The plots each stage drew and logged, read back rather than drawn again.
            logged = {}
            for run in runs:
                stage = run.data.tags.get(STAGE_TAG)
                if stage in ("sweep", "train", "evaluate"):
                    os.makedirs(os.path.join(tmp, stage), exist_ok=True)
                    logged.update(tracker.download_plots(run.info.run_id, os.path.join(tmp, stage)))
            plots = report_plots(
                tmp,
                sweep=summary.sweep,
                asha=config.sweep.asha,
                train_history=train_history,
                per_class=eval_result.per_class,
                confusion=eval_result.confusion,
                class_names=eval_result.class_names,
                actual=eval_result.actual,
                predicted=eval_result.predicted,
                logged=logged,
            )
            html = report_html(summary, config, plots, per_class=eval_result.per_class, links=links)
        tracker.log_text(parent, html, "report.html")
        location = ui.artifact_url(tracker, parent, "report.html")
    except Exception as exc:  # the report must not fail a finished run
        logger.warning("the HTML report was not built: %s: %s", type(exc).__name__, exc)
        return None
    create_markdown_artifact(
        report_markdown(summary, location),
        key="trainflow-report",
        description=f"trainflow report of run {summary.run_id}",
    )
    logger.info("report: %s", location)
    return location
