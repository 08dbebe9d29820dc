"""The one module that imports mlflow: runs, metrics, artifacts, the model registry and its gate.

Every call names its run explicitly through an :class:`mlflow.MlflowClient` (Prefect tasks run in
threads, so a process-global "active run" would be shared between them). The only exception is
:meth:`Tracker.log_and_register_model`, which needs the fluent API for ``mlflow.pytorch.log_model``
and opens a short ``with mlflow.start_run(run_id=...)`` around it.

Run tree of one pipeline run (``<run_id>`` is the flow's run id)::

    pipeline-<run_id>                 tags trainflow.run_id, trainflow.stage=pipeline; params
      ├── <stage child runs>          tag trainflow.stage (preprocess, sweep, train, evaluate, ...)
      │     └── <one run per trial>   created by the Tune callback under the sweep run, renamed
      │                               "trial 03 · lr=0.0031" after the sweep (rename_run)
      └── ...

A re-run with the same ``run_id`` finds and resumes the same runs instead of creating new ones.

Registered model versions carry the gate's decision as tags (``gate.metric``, ``gate.value``,
``gate.champion_value``, ``gate.previous_champion``, ``gate.decision``) and two aliases:
``challenger`` (the latest candidate) and ``champion`` (the model in use).

The model's weights file (our own ``state_path``, read back with ``torch.load(weights_only=True)``)
is stored inside the MLflow model as an extra file: ``<model artifacts>/extra_files/<file name>``;
:meth:`Tracker.model_files` returns its local path for any ``models:/`` or ``runs:/`` URI.

Nothing here runs at import time; mlflow itself is imported inside the functions that need it.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import importlib.metadata
import json
import logging
import math
import numbers
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from training.config import MlflowConfig, PipelineConfig
from training.errors import (
    ConfigError,
    ModelNotFoundError,
    ServiceUnreachableError,
    TrainflowError,
)
from training.storage import default_artifact_root, default_tracking_uri, trainflow_home

if TYPE_CHECKING:
    import numpy as np
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import Run

log = logging.getLogger(__name__)

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
# MLflow's defaults (7 retries with backoff, 120 s timeout) make one call against a dead server
# take ~4 minutes; these bound it unless the user set them.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
HEALTH_TIMEOUT_S = 5.0

RUN_ID_TAG = "trainflow.run_id"
STAGE_TAG = "trainflow.stage"
PARENT_TAG = "mlflow.parentRunId"
CHAMPION = "champion"
CHALLENGER = "challenger"
LOWER_IS_BETTER = {"test_loss"}
# The promotion lock (Tracker.registry_lock): a registered model that exists while held.
LOCK_SUFFIX = ".champion-lock"
LOCK_OWNER_TAG = "trainflow.lock_owner"
LOCK_TIMEOUT_S = 60.0
LOCK_STALE_S = 300.0  # far longer than a promotion takes (~1 s)
STATE_DIR_IN_MODEL = "extra_files"  # where mlflow puts extra_files inside the model artifacts

# MLflow's limits (mlflow/utils/validation.py).
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_RUN_NAME_LENGTH = 250

# Where `mlflow ui` (see Tracker.ui_command) serves a local store.
LOCAL_UI_URL = "http://127.0.0.1:5000"
# Tune's bookkeeping in each trial result: not worth a metric on every trial run.
_TUNE_BOOKKEEPING = {
    "timestamp",
    "should_checkpoint",
    "done",
    "pid",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "trial_id",
    "date",
    "hostname",
    "node_ip",
}

_VERSIONED_PACKAGES = ("torch", "ray", "prefect", "mlflow", "trainflow")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_TERMINAL = {"FINISHED", "FAILED", "KILLED"}
_UNFINISHED = {"RUNNING", "SCHEDULED"}


# ---------------------------------------------------------------------------------------- helpers


def redact(text: str) -> str:
    """Hide ``user:password@`` in every URI inside ``text``."""
    return _USERINFO.sub("***@", text)


def _redact_tree(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_tree(v) for v in value]
    return value


def _without_userinfo(uri: str) -> str:
    """A URL to show (and click): credentials dropped, not masked."""
    return _USERINFO.sub("", uri)


def _is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _quote(value: str) -> str:
    """A string literal for an MLflow search filter (which has no escapes)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ConfigError(f"{value!r} cannot hold both ' and \" (MLflow search cannot match it)")


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _metric_value(value: Any) -> float | None:
    """A finite float, or None for what MLflow cannot plot (strings, bools, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///")
    return None if path in ("", ":memory:") else Path(path if path.startswith("/") else f"/{path}")


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", commit) else None


# ------------------------------------------------------------------------------ set-up and checks


def resolve_tracking_uri(cfg: MlflowConfig) -> str:
    """``$MLFLOW_TRACKING_URI``, else ``mlflow.tracking_uri``, else sqlite in the trainflow home."""
    uri = os.environ.get(TRACKING_URI_ENV) or cfg.tracking_uri
    if uri:
        return uri.rstrip("/") if _is_http(uri) else uri
    trainflow_home().mkdir(parents=True, exist_ok=True)
    return default_tracking_uri()


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
    """GET ``<uri>/health``; raise ServiceUnreachableError naming the fix if it does not answer."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host  # IPv6 literal
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    health = urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", "")
    )
    request = urllib.request.Request(health)
    if parts.username is not None:
        token = (
            f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        )
        request.add_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):  # it answers; MLflow's own calls carry the credentials
            return
        reason = f"GET /health answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = str(getattr(exc, "reason", exc))
    else:
        if status == 200:
            return
        reason = f"GET /health answered HTTP {status}"
    raise ServiceUnreachableError(
        f"MLflow tracking server {redact(uri)} is not reachable ({redact(reason)}); start it "
        "(`trainflow up`) or set mlflow.tracking_uri / MLFLOW_TRACKING_URI"
    )


@contextlib.contextmanager
def _global_uris(uri: str):
    """Point MLflow's process-wide tracking and registry URIs at ``uri`` for a block.

    MLflow also exports them as MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI; left behind, every
    process started later (a server, a worker, another pipeline) would inherit our store.
    """
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def configure(config: PipelineConfig, create: bool = True) -> Tracker:
    """Connect to the tracking store and get or create the experiment.

    ``create=False`` only reads: a missing store or experiment raises TrainflowError (naming
    what is there) instead of being created.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    for key, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    uri = resolve_tracking_uri(config.mlflow)
    if config.storage.endpoint_url:
        # MLflow's S3 artifact store (boto3) reads its endpoint from here; not a credential.
        os.environ.setdefault("MLFLOW_S3_ENDPOINT_URL", config.storage.endpoint_url)
    if _is_http(uri):
        check_reachable(uri)
    db = _sqlite_path(uri)
    if db is not None:
        if not create and not db.is_file():
            raise TrainflowError(
                f"no MLflow store at {db}: nothing was tracked there yet; run `trainflow run` "
                "first, or point mlflow.tracking_uri / MLFLOW_TRACKING_URI at your store"
            )
        db.parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    name = config.mlflow.experiment
    experiment = client.get_experiment_by_name(name)
    if experiment is None and not create:
        names = sorted(e.name for e in client.search_experiments(max_results=50))
        raise TrainflowError(
            f"no MLflow experiment {name!r} in {redact(uri)}; experiments there: "
            f"{', '.join(names) or 'none'} (choose one with mlflow.experiment, e.g. "
            "`trainflow compare --experiment NAME`)"
        )
    if experiment is None:
        try:
            experiment_id = client.create_experiment(
                name, artifact_location=_artifact_location(uri, name, config.storage.root)
            )
        except MlflowException as exc:  # created meanwhile by another process
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
            experiment_id = experiment.experiment_id
            log.debug("experiment %s created concurrently: %s", name, exc)
    elif experiment.lifecycle_stage == "deleted":
        raise ConfigError(
            f"MLflow experiment {name!r} is deleted; restore it (`mlflow experiments restore "
            f"--experiment-id {experiment.experiment_id}`) or set mlflow.experiment to another name"
        )
    else:
        experiment_id = experiment.experiment_id
    return Tracker(client, uri, experiment_id, config)


def _artifact_location(uri: str, experiment: str, storage_root: str | None = None) -> str | None:
    """Local sqlite stores keep artifacts beside the database (MLflow's default is ./mlruns of the
    current directory), or under an s3:// storage root; servers use their own default."""
    db = _sqlite_path(uri)
    if db is not None and storage_root and storage_root.startswith("s3://"):
        return f"{storage_root.rstrip('/')}/mlartifacts/{experiment}"
    if uri == default_tracking_uri():
        return f"{default_artifact_root()}/{experiment}"
    if db is not None:
        return f"{(db.parent / 'mlartifacts').as_uri()}/{experiment}"
    return None


# ------------------------------------------------------------------------------------ the tracker


class Tracker:
    """Runs of one experiment; every method takes the run id it writes to."""

    def __init__(
        self, client: MlflowClient, tracking_uri: str, experiment_id: str, config: PipelineConfig
    ) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.config = config

    def __repr__(self) -> str:
        return f"Tracker({redact(self.tracking_uri)!r}, experiment_id={self.experiment_id!r})"

    # -- runs ---------------------------------------------------------------------------------

    def _search(self, filter_string: str, experiment_ids: list[str] | None = None) -> list[Run]:
        runs: list[Run] = []
        token = None
        while True:
            page = self.client.search_runs(
                experiment_ids or [self.experiment_id],
                filter_string=filter_string,
                max_results=1000,
                order_by=["attributes.start_time ASC"],
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def _resume(self, run: Run) -> str:
        run_id = run.info.run_id
        if run.info.status != "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        return run_id

    def start_parent_run(self, run_id: str, tags: dict[str, Any] | None = None) -> str:
        """Get or create the top-level run of pipeline run ``run_id``; it is RUNNING afterwards."""
        found = [
            run
            for run in self._search(f"tags.`{RUN_ID_TAG}` = {_quote(run_id)}")
            if PARENT_TAG not in run.data.tags
        ]
        if found:
            parent = self._resume(found[0])
            if tags:
                self.set_tags(parent, tags)
            return parent
        all_tags = {
            **(tags or {}),
            RUN_ID_TAG: run_id,
            STAGE_TAG: "pipeline",
            **_package_versions(),
        }
        commit = _git_commit()
        if commit:
            all_tags.update({"git.commit": commit, "mlflow.source.git.commit": commit})
        run = self.client.create_run(
            self.experiment_id, run_name=f"pipeline-{run_id}", tags=self._tag_values(all_tags)
        )
        parent = run.info.run_id
        self.log_params(parent, self.config.flat())
        resolved = _redact_tree(self.config.model_dump(mode="json"))
        self.log_text(parent, yaml.safe_dump(resolved, sort_keys=False), "config.yaml")
        return parent

    def start_child_run(
        self, parent_id: str, name: str, stage: str, tags: dict[str, Any] | None = None
    ) -> str:
        """Get or create the child run ``name`` of ``parent_id``; it is RUNNING afterwards."""
        found = self._search(
            f"tags.`{PARENT_TAG}` = {_quote(parent_id)} and attributes.run_name = {_quote(name)}"
        )
        if found:
            child = self._resume(found[0])
            if tags:
                self.set_tags(child, tags)
            return child
        parent_tags = self.client.get_run(parent_id).data.tags
        all_tags = {**(tags or {}), PARENT_TAG: parent_id, STAGE_TAG: stage}
        if RUN_ID_TAG in parent_tags:
            all_tags.setdefault(RUN_ID_TAG, parent_tags[RUN_ID_TAG])
        run = self.client.create_run(
            self.experiment_id, run_name=name, tags=self._tag_values(all_tags)
        )
        return run.info.run_id

    def find_runs(self, parent_id: str) -> list[Run]:
        """Every descendant of ``parent_id`` (children, grandchildren, ...), breadth first."""
        experiment_ids = [self.client.get_run(parent_id).info.experiment_id]
        if self.experiment_id not in experiment_ids:
            experiment_ids.append(self.experiment_id)
        found: list[Run] = []
        frontier = [parent_id]
        seen = {parent_id}
        while frontier:
            next_frontier = []
            for run_id in frontier:
                for run in self._search(f"tags.`{PARENT_TAG}` = {_quote(run_id)}", experiment_ids):
                    if run.info.run_id not in seen:
                        seen.add(run.info.run_id)
                        found.append(run)
                        next_frontier.append(run.info.run_id)
            frontier = next_frontier
        return found

    def rename_run(self, run_id: str, name: str) -> None:
        """Give a run the name the MLflow UI shows (e.g. a trial's number and params)."""
        self.client.update_run(run_id, name=name[:MAX_RUN_NAME_LENGTH])

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        if status not in _TERMINAL:
            raise ValueError(f"status must be one of {sorted(_TERMINAL)}, got {status!r}")
        self.client.set_terminated(run_id, status=status)

    def close_unfinished(
        self, parent_id: str, status: str, include_parent: bool = True
    ) -> list[str]:
        """End every descendant still RUNNING with ``status``, then the parent (unless
        ``include_parent`` is false); returns the ids of the runs it ended."""
        if status not in _TERMINAL:
            raise ValueError(f"status must be one of {sorted(_TERMINAL)}, got {status!r}")
        closed = []
        for run in reversed(self.find_runs(parent_id)):  # deepest first
            if run.info.status in _UNFINISHED:
                self.client.set_terminated(run.info.run_id, status=status)
                closed.append(run.info.run_id)
        if include_parent and self.client.get_run(parent_id).info.status in _UNFINISHED:
            self.client.set_terminated(parent_id, status=status)
            closed.append(parent_id)
        return closed

    # -- params, tags, metrics, artifacts ----------------------------------------------------

    @staticmethod
    def _tag_values(tags: dict[str, Any]) -> dict[str, str]:
        return {str(k): redact(str(v))[:MAX_TAG_VAL_LENGTH] for k, v in tags.items()}

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Values stringified (URIs redacted), truncated to MLflow's 6000 characters."""
        from mlflow.entities import Param

        items = [Param(str(k), redact(str(v))[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()]
        for batch in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=batch)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in self._tag_values(tags).items()]
        for batch in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, tags=batch)

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int | None = None) -> None:
        """Numeric, finite values only; others (strings, bools, NaN, inf) are skipped."""
        timestamp = int(time.time() * 1000)
        self._log_metric_rows(run_id, [(metrics, step or 0, timestamp)])

    def log_history(self, run_id: str, rows: list[dict[str, Any]], step_key: str = "epoch") -> None:
        """One metric point per numeric value of each row, at ``step=row[step_key]``."""
        start = int(time.time() * 1000)
        entries = []
        for index, row in enumerate(rows):
            step = row.get(step_key, index)
            step = int(step) if _metric_value(step) is not None else index
            values = {k: v for k, v in row.items() if k != step_key}
            entries.append((values, step, start + index))
        self._log_metric_rows(run_id, entries)

    def _log_metric_rows(self, run_id: str, entries: Iterable[tuple[dict, int, int]]) -> None:
        from mlflow.entities import Metric

        metrics = []
        for values, step, timestamp in entries:
            for key, raw in values.items():
                value = _metric_value(raw)
                if value is not None:
                    metrics.append(Metric(str(key), value, timestamp, int(step)))
        for batch in _chunks(metrics, MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=batch)

    def log_dict(self, run_id: str, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(run_id, obj, artifact_file)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(local_path), artifact_path)

    def log_figure(self, run_id: str, fig_path: str, artifact_file: str) -> None:
        """Log an image file already written (see training.report) as ``artifact_file``."""
        directory, name = os.path.split(artifact_file)
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, name)
            shutil.copyfile(fig_path, target)
            self.client.log_artifact(run_id, target, directory or None)

    # -- Ray Tune ----------------------------------------------------------------------------

    def tune_callback(self, sweep_run_id: str):
        """A Tune callback that writes one child run per trial under ``sweep_run_id``, ended
        FINISHED (or FAILED) with the trial."""
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        tags = {PARENT_TAG: sweep_run_id, STAGE_TAG: "trial"}
        run_tag = self.client.get_run(sweep_run_id).data.tags.get(RUN_ID_TAG)
        if run_tag:
            tags[RUN_ID_TAG] = run_tag

        class TrialMetricsCallback(MLflowLoggerCallback):
            """Logs the loop's metrics (train_loss, val_loss, val_accuracy, ...) with
            step=training_iteration, without Tune's bookkeeping (pid, timestamp, done,
            config/...), so the compare view lists what matters."""

            def log_trial_result(self, iteration: int, trial, result: dict) -> None:
                kept = {
                    key: value
                    for key, value in result.items()
                    if key not in _TUNE_BOOKKEEPING and not str(key).startswith("config")
                }
                super().log_trial_result(iteration, trial, kept)

        return TrialMetricsCallback(
            tracking_uri=self.tracking_uri,
            experiment_name=self.config.mlflow.experiment,
            tags=tags,
            save_artifact=False,
        )

    # -- reading a sweep back (trainflow compare) ----------------------------------------------

    def recent_pipeline_runs(self, limit: int = 5) -> list[dict[str, Any]]:
        """The latest pipeline (parent) runs of the experiment, newest first."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STAGE_TAG}` = 'pipeline'",
            max_results=limit,
            order_by=["attributes.start_time DESC"],
        )
        return [
            {"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status}
            for r in runs
        ]

    def _where_to_look(self) -> str:
        recent = self.recent_pipeline_runs()
        listing = ", ".join(f"{r['name']} ({r['run_id']})" for r in recent) or "none"
        return (
            f"pipeline runs of experiment {self.config.mlflow.experiment!r}, newest first: "
            f"{listing}; list them all with `mlflow runs list --experiment-id "
            f"{self.experiment_id}` (MLFLOW_TRACKING_URI={redact(self.tracking_uri)})"
        )

    def _sweep_run(self, run_id: str | None) -> Run:
        from mlflow.exceptions import MlflowException

        if run_id is None:
            found = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{STAGE_TAG}` = 'sweep'",
                max_results=1,
                order_by=["attributes.start_time DESC"],
            )
            if not found:
                raise TrainflowError(
                    f"experiment {self.config.mlflow.experiment!r} in {redact(self.tracking_uri)} "
                    f"has no sweep yet (run `trainflow run`); {self._where_to_look()}"
                )
            return found[0]
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            raise TrainflowError(
                f"no run {run_id!r} in {redact(self.tracking_uri)}; {self._where_to_look()}"
            ) from None
        stage = run.data.tags.get(STAGE_TAG)
        if stage == "sweep":
            return run
        if stage == "trial" and PARENT_TAG in run.data.tags:
            return self.client.get_run(run.data.tags[PARENT_TAG])
        sweeps = self.client.search_runs(
            [run.info.experiment_id],
            filter_string=(
                f"tags.`{PARENT_TAG}` = {_quote(run_id)} and tags.`{STAGE_TAG}` = 'sweep'"
            ),
            max_results=1,
        )
        if not sweeps:
            raise TrainflowError(
                f"run {run_id!r} ({run.info.run_name}) has no sweep (was sweep.enabled false?); "
                f"{self._where_to_look()}"
            )
        return sweeps[0]

    def sweep_trials(self, run_id: str | None = None) -> dict[str, Any]:
        """One sweep and its trial runs as plain dicts (what `trainflow compare` shows).

        ``run_id``: a pipeline (parent) run, its sweep run or one of its trial runs; None: the
        latest sweep of the experiment. Each trial carries its name, params, last ``metrics``,
        ``best_value`` (best of the sweep metric over its epochs), ``epochs`` and fate tags.
        """
        sweep = self._sweep_run(run_id)
        metric = sweep.data.params.get("metric") or self.config.sweep.metric
        mode = "min" if metric.endswith("loss") else "max"
        parent_id = sweep.data.tags.get(PARENT_TAG)
        experiment = self.client.get_experiment(sweep.info.experiment_id)
        trials = []
        for run in self._search(
            f"tags.`{PARENT_TAG}` = {_quote(sweep.info.run_id)}", [sweep.info.experiment_id]
        ):
            history = self.client.get_metric_history(run.info.run_id, metric)
            values = [m.value for m in history if math.isfinite(m.value)]
            tags = run.data.tags
            trials.append(
                {
                    "run_id": run.info.run_id,
                    "name": run.info.run_name,
                    "status": run.info.status,
                    "trial_id": tags.get("trainflow.trial_id") or tags.get("trial_name", ""),
                    "params": dict(run.data.params),
                    "metrics": dict(run.data.metrics),
                    "best_value": (max if mode == "max" else min)(values) if values else None,
                    "epochs": max((m.step for m in history), default=0),
                    "fate": tags.get("trainflow.fate", ""),
                    "fate_detail": tags.get("trainflow.fate_detail")
                    or tags.get("trainflow.fate", ""),
                    "best": tags.get("trainflow.best") == "true",
                }
            )
        return {
            "tracking_uri": redact(self.tracking_uri),
            "experiment_id": sweep.info.experiment_id,
            "experiment": experiment.name,
            "parent_run_id": parent_id,
            "parent_run_name": self.client.get_run(parent_id).info.run_name if parent_id else None,
            "sweep_run_id": sweep.info.run_id,
            "metric": metric,
            "mode": mode,
            "max_t": sweep.data.params.get("asha.max_t"),
            "trials": trials,
        }

    # -- model registry ----------------------------------------------------------------------

    def log_and_register_model(
        self,
        run_id: str,
        model: torch.nn.Module,
        input_example: np.ndarray,
        state_path: str,
        description: str,
        tags: dict[str, Any] | None = None,
        reuse_existing: bool = True,
    ) -> dict[str, str]:
        """Log ``model`` as an MLflow model under ``run_id`` and register a new version.

        ``input_example`` needs a batch of more than one row (torch.export makes a batch dimension
        of size 1 static). ``state_path`` (our checkpoint file) is stored in the model as
        ``extra_files/<file name>``; :meth:`model_files` finds it again.

        With ``reuse_existing`` a version already registered from ``run_id`` (a retried task) is
        returned instead of registering a duplicate.
        """
        import mlflow
        import mlflow.pytorch
        import numpy as np
        import torch
        from mlflow.models import infer_signature

        name = self.config.mlflow.registered_model
        state_file = f"{STATE_DIR_IN_MODEL}/{os.path.basename(state_path)}"
        existing = self._version_of_run(name, run_id) if reuse_existing else None
        if existing is not None:
            log.info(
                "model version %s of %s already registered from run %s",
                existing.version,
                name,
                run_id,
            )
            return {
                "name": name,
                "version": str(existing.version),
                "model_uri": f"models:/{name}/{existing.version}",
                "logged_model_uri": existing.source,
                "source_run_id": run_id,
                "state_file": state_file,
            }

        model = copy.deepcopy(model).cpu().eval()
        param = next(model.parameters(), None)
        example = np.asarray(input_example)
        if (
            param is not None
            and param.is_floating_point()
            and np.issubdtype(example.dtype, np.floating)
        ):
            example = example.astype(torch.empty((), dtype=param.dtype).numpy().dtype)
        with torch.no_grad():
            output = model(torch.from_numpy(example)).numpy()
        signature = infer_signature(example, output)

        was_running = self.client.get_run(run_id).info.status == "RUNNING"
        try:
            # The fluent API reads the process-wide URIs.
            with _global_uris(self.tracking_uri), mlflow.start_run(run_id=run_id):
                info = mlflow.pytorch.log_model(
                    model,
                    name="model",
                    signature=signature,
                    input_example=example,
                    extra_files=[str(state_path)],
                    # Given, not inferred: inference loads the model in a subprocess (~5 s) and
                    # lists every package the process happens to import.
                    pip_requirements=_model_requirements(),
                )
        finally:
            if was_running:  # leaving the `with` ended the run; ending it is the caller's job
                self.client.update_run(run_id, status="RUNNING")

        with _global_uris(self.tracking_uri):
            version = mlflow.register_model(
                info.model_uri, name, tags=self._tag_values(tags or {}) or None
            )
        self.client.update_model_version(name, version.version, description=description)
        return {
            "name": name,
            "version": str(version.version),
            "model_uri": f"models:/{name}/{version.version}",
            "logged_model_uri": info.model_uri,
            "source_run_id": run_id,
            "state_file": state_file,
        }

    def _version_of_run(self, name: str, run_id: str):
        """The oldest version of ``name`` registered from ``run_id``, or None."""
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(
                f"name = {_quote(name)} and run_id = {_quote(run_id)}"
            )
        except MlflowException as exc:
            log.debug("no versions of %s from run %s: %s", name, run_id, exc)
            return None
        return min(versions, key=lambda v: int(v.version)) if versions else None

    def promote(self, version: str, challenger_value: float) -> dict[str, Any]:
        """Alias ``challenger`` to ``version``; move ``champion`` to it only if it wins the gate.

        The gate compares ``challenger_value`` with the champion's ``gate.value`` tag
        (``test_loss``: lower is better, the others higher) and needs an improvement larger than
        ``mlflow.gate.min_delta``. A champion without a value for the same metric cannot be
        compared and is replaced (decision "promoted", champion_value None).
        """
        name = self.config.mlflow.registered_model
        version = str(version)
        challenger_value = float(challenger_value)
        # Read the champion, compare and move the aliases as one step: two runs promoting at
        # once must not both read the old champion and the worse one write last.
        with self.registry_lock(name):
            self.client.set_registered_model_alias(name, CHALLENGER, version)
            return self._gate(name, version, challenger_value)

    def _gate(self, name: str, version: str, challenger_value: float) -> dict[str, Any]:
        from mlflow.exceptions import MlflowException

        gate = self.config.mlflow.gate
        try:
            champion = self.client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST" and "not found" not in str(exc).lower():
                raise
            champion = None

        champion_value: float | None = None
        previous: str | None = None
        if champion is None:
            decision = "first-model"
        elif str(champion.version) == version:  # a retry after this version already won
            current = self.client.get_model_version(name, version).tags
            decision = current.get("gate.decision", "promoted")
            champion_value = _float_or_none(current.get("gate.champion_value"))
            previous = current.get("gate.previous_champion") or None
        else:
            previous = str(champion.version)
            if champion.tags.get("gate.metric") == gate.metric:
                champion_value = _float_or_none(champion.tags.get("gate.value"))
            if champion_value is None:
                decision = "promoted"
            else:
                if gate.metric in LOWER_IS_BETTER:
                    gain = champion_value - challenger_value
                else:
                    gain = challenger_value - champion_value
                decision = "promoted" if gain > gate.min_delta else "kept-champion"

        if decision != "kept-champion":
            self.client.set_registered_model_alias(name, CHAMPION, version)
        if champion is None or str(champion.version) != version:
            gate_tags = {
                "gate.metric": gate.metric,
                "gate.value": repr(challenger_value),
                "gate.champion_value": "none" if champion_value is None else repr(champion_value),
                "gate.previous_champion": previous or "none",
                "gate.decision": decision,
            }
            for key, value in gate_tags.items():
                self.client.set_model_version_tag(name, version, key, value)
        aliases = list(self.client.get_model_version(name, version).aliases)
        return {
            "decision": decision,
            "champion_version": version if decision != "kept-champion" else previous,
            "challenger_version": version,
            "challenger_value": challenger_value,
            "champion_value": champion_value,
            "aliases": sorted(aliases),
        }

    @contextlib.contextmanager
    def registry_lock(self, name: str, timeout_s: float = LOCK_TIMEOUT_S):
        """A mutex over the MLflow store, so it works alike on sqlite and an ``mlflow server``:
        creating a registered model is atomic (the store's unique name), so the process that
        creates ``<name>.champion-lock`` holds the lock and deletes it when done. A lock left by
        a crashed process is broken once older than ``LOCK_STALE_S``."""
        from mlflow.exceptions import MlflowException

        lock = f"{name}{LOCK_SUFFIX}"
        owner = uuid.uuid4().hex
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.create_registered_model(
                    lock,
                    tags={LOCK_OWNER_TAG: owner},
                    description=f"trainflow: held while the {CHAMPION} alias of {name} moves",
                )
                break
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            self._break_stale_lock(lock)
            if time.monotonic() > deadline:
                raise TrainflowError(
                    f"could not take the promotion lock {lock!r} in {timeout_s:.0f} s: another "
                    f"run is promoting a model of {name}; retry, or delete the registered model "
                    f"{lock!r} if no run is promoting"
                )
            time.sleep(0.1 + random.random() * 0.2)
        try:
            yield
        finally:
            with contextlib.suppress(MlflowException):
                held = self.client.get_registered_model(lock)
                if held.tags.get(LOCK_OWNER_TAG) == owner:
                    self.client.delete_registered_model(lock)

    def _break_stale_lock(self, lock: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            held = self.client.get_registered_model(lock)
        except MlflowException:
            return  # released meanwhile
        age_s = time.time() - (held.creation_timestamp or 0) / 1000
        if age_s > LOCK_STALE_S:
            log.warning("breaking the promotion lock %s left %.0f s ago", lock, age_s)
            with contextlib.suppress(MlflowException):
                self.client.delete_registered_model(lock)

    def describe_model(self, description: str, version: str | None = None) -> None:
        """Set the description of the registered model, or of one of its versions."""
        name = self.config.mlflow.registered_model
        if version is None:
            self.client.update_registered_model(name, description=description)
        else:
            self.client.update_model_version(name, str(version), description=description)

    def model_files(self, model_uri: str, dst_path: str | None = None) -> Path:
        """The local path of our state file inside the model at ``model_uri``
        (``models:/name@alias``, ``models:/name/version``, ``models:/m-...`` or ``runs:/...``)."""
        import mlflow
        import mlflow.artifacts
        from mlflow.exceptions import MlflowException
        from mlflow.models import Model

        # models:/ URIs resolve through the process-wide registry URI, whatever is passed below.
        try:
            with _global_uris(self.tracking_uri):
                local = mlflow.artifacts.download_artifacts(
                    artifact_uri=model_uri,
                    dst_path=dst_path,
                    tracking_uri=self.tracking_uri,
                    registry_uri=self.tracking_uri,
                )
            flavor = Model.load(local).flavors.get("pytorch", {})
        except (MlflowException, OSError) as exc:
            reason = (redact(str(exc)).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelNotFoundError(
                f"model {model_uri!r} was not found in the MLflow store "
                f"{redact(self.tracking_uri)} ({reason}); see the registered models in the "
                f"MLflow UI (`{self.ui_command()}`) or use "
                f"models:/{self.config.mlflow.registered_model}@{CHAMPION}"
            ) from None
        extra = [entry["path"] for entry in flavor.get("extra_files", [])]
        if not extra:
            raise ModelNotFoundError(
                f"model {model_uri!r} has no trainflow state file (extra_files); it was not logged "
                "by trainflow — pass a model registered by `trainflow run`"
            )
        return Path(local) / extra[0]

    # -- where to look -----------------------------------------------------------------------

    def ui_command(self) -> str:
        """The shell command (or URL) that shows these runs in the MLflow UI."""
        if _is_http(self.tracking_uri):
            return _without_userinfo(self.tracking_uri)
        return f"mlflow ui --backend-store-uri {self.tracking_uri} --host 127.0.0.1 --port 5000"

    def run_url(self, run_id: str) -> str | None:
        """The run's page on the tracking server; None for a local store."""
        if not _is_http(self.tracking_uri):
            return None
        base = _without_userinfo(self.tracking_uri)
        return f"{base}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def ui_url(self) -> str:
        """The MLflow UI's address: the tracking server, or where `mlflow ui` serves."""
        return _without_userinfo(self.tracking_uri) if _is_http(self.tracking_uri) else LOCAL_UI_URL

    def compare_url(self, run_ids: Iterable[str], experiment_ids: Iterable[str] = ()) -> str:
        """The MLflow UI's compare view of ``run_ids`` (under :meth:`ui_url`)."""
        runs = urllib.parse.quote(json.dumps(list(run_ids), separators=(",", ":")), safe="")
        experiments = list(experiment_ids) or [self.experiment_id]
        exps = urllib.parse.quote(json.dumps(experiments, separators=(",", ":")), safe="")
        return f"{self.ui_url()}/#/compare-runs?runs={runs}&experiments={exps}"

    def artifact_url(self, run_id: str, path: str) -> str:
        """Where a user opens a run's artifact: its page in the UI of a tracking server, else
        its location in the artifact store (a file:// URI for a local store)."""
        url = self.run_url(run_id)
        if url is not None:
            return f"{url}/artifactPath/{path}"
        return f"{self.client.get_run(run_id).info.artifact_uri.rstrip('/')}/{path}"


def _model_requirements() -> list[str]:
    """What loading the model (torch.export's pt2 format through mlflow.pyfunc) needs."""
    requirements = []
    for package in ("mlflow", "torch", "numpy"):
        try:
            version = importlib.metadata.version(package).split("+")[0]  # drop "+cpu"
        except importlib.metadata.PackageNotFoundError:
            continue
        requirements.append(f"{package}=={version}")
    return requirements


def _float_or_none(value: str | None) -> float | None:
    try:
        result = float(value) if value is not None else None
    except ValueError:
        return None
    return result if result is not None and math.isfinite(result) else None
