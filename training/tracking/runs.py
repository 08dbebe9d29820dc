"""The run tree of a pipeline run, and what is logged to its runs (params, tags, metrics, files)."""

from __future__ import annotations

import math
import numbers
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import yaml

from training.config import PipelineConfig
from training.errors import ConfigError
from training.platform.secrets import redact, redact_tree
from training.tracking.provenance import provenance_tags

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

RUN_ID_TAG = "trainflow.run_id"
STAGE_TAG = "trainflow.stage"
PARENT_TAG = "mlflow.parentRunId"
# What MLflow's UI shows as "Source" and "Created by"; set on the parent, passed down the tree.
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type", "mlflow.user")

# MLflow's limits (mlflow/utils/validation.py).
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_RUN_NAME_LENGTH = 250

TERMINAL = {"FINISHED", "FAILED", "KILLED"}
UNFINISHED = {"RUNNING", "SCHEDULED"}


def filter_literal(value: str) -> str:
    """A string literal for an MLflow search filter (which has no escapes)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ConfigError(f"{value!r} cannot hold both ' and \" (MLflow search cannot match it)")


def tag_values(tags: dict[str, Any]) -> dict[str, str]:
    """Tags as MLflow stores them: strings, URIs redacted, cut to MLflow's length limit."""
    return {str(k): redact(str(v))[:MAX_TAG_VAL_LENGTH] for k, v in tags.items()}


def inherited_tags(parent_tags: dict[str, str]) -> dict[str, str]:
    """What a child run takes from its parent: the pipeline run's id, its source and user."""
    return {key: parent_tags[key] for key in (RUN_ID_TAG, *SOURCE_TAGS) if key in parent_tags}


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _metric_value(value: Any) -> float | None:
    """A finite float, or None for what MLflow cannot plot (strings, bools, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _check_terminal(status: str) -> None:
    if status not in TERMINAL:
        raise ValueError(f"status must be one of {sorted(TERMINAL)}, got {status!r}")


class Tracker:
    """Runs of one experiment in one tracking store; every method takes the run id it writes to.

    Made by :func:`training.tracking.store.configure`.
    """

    def __init__(
        self, client: MlflowClient, tracking_uri: str, experiment_id: str, config: PipelineConfig
    ) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.config = config

    def __repr__(self) -> str:
        return f"Tracker({redact(self.tracking_uri)!r}, experiment_id={self.experiment_id!r})"

    # -- the run tree ----------------------------------------------------------------------------

    def search(self, filter_string: str, experiment_ids: list[str] | None = None) -> list[Run]:
        """Every run matching ``filter_string`` (all pages), oldest first."""
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

    def _resume(self, run: Run, tags: dict[str, Any] | None) -> str:
        run_id = run.info.run_id
        if run.info.status != "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        if tags:
            self.set_tags(run_id, tags)
        return run_id

    def start_parent_run(self, run_id: str, tags: dict[str, Any] | None = None) -> str:
        """Get or create the top-level run of pipeline run ``run_id``; it is RUNNING afterwards."""
        found = [
            run
            for run in self.search(f"tags.`{RUN_ID_TAG}` = {filter_literal(run_id)}")
            if PARENT_TAG not in run.data.tags
        ]
        if found:
            return self._resume(found[0], tags)
        all_tags = {**(tags or {}), RUN_ID_TAG: run_id, STAGE_TAG: "pipeline", **provenance_tags()}
        run = self.client.create_run(
            self.experiment_id, run_name=f"pipeline-{run_id}", tags=tag_values(all_tags)
        )
        parent = run.info.run_id
        # A swept key's value is known after the sweep (which logs the champion's); MLflow
        # params cannot change, so the default is not logged first.
        swept = set(self.config.sweep.search_space) if self.config.sweep.enabled else set()
        self.log_params(parent, {k: v for k, v in self.config.flat().items() if k not in swept})
        resolved = redact_tree(self.config.model_dump(mode="json"))
        self.log_text(parent, yaml.safe_dump(resolved, sort_keys=False), "config.yaml")
        return parent

    def start_child_run(
        self, parent_id: str, name: str, stage: str, tags: dict[str, Any] | None = None
    ) -> str:
        """Get or create the child run ``name`` of ``parent_id``; it is RUNNING afterwards."""
        found = self.search(
            f"tags.`{PARENT_TAG}` = {filter_literal(parent_id)} "
            f"and attributes.run_name = {filter_literal(name)}"
        )
        if found:
            return self._resume(found[0], tags)
        parent_tags = self.client.get_run(parent_id).data.tags
        all_tags = {
            **inherited_tags(parent_tags),
            **(tags or {}),
            PARENT_TAG: parent_id,
            STAGE_TAG: stage,
        }
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tag_values(all_tags))
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
                children = self.search(
                    f"tags.`{PARENT_TAG}` = {filter_literal(run_id)}", experiment_ids
                )
                for run in children:
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
        _check_terminal(status)
        self.client.set_terminated(run_id, status=status)

    def close_unfinished(
        self, parent_id: str, status: str, include_parent: bool = True
    ) -> list[str]:
        """End every descendant still RUNNING with ``status``, then the parent (unless
        ``include_parent`` is false); returns the ids of the runs it ended."""
        _check_terminal(status)
        closed = []
        for run in reversed(self.find_runs(parent_id)):  # deepest first
            if run.info.status in UNFINISHED:
                self.client.set_terminated(run.info.run_id, status=status)
                closed.append(run.info.run_id)
        if include_parent and self.client.get_run(parent_id).info.status in UNFINISHED:
            self.client.set_terminated(parent_id, status=status)
            closed.append(parent_id)
        return closed

    # -- params, tags, metrics, artifacts --------------------------------------------------------

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Values stringified (URIs redacted), truncated to MLflow's 6000 characters."""
        from mlflow.entities import Param

        items = [Param(str(k), redact(str(v))[:MAX_PARAM_VAL_LENGTH]) for k, v in params.items()]
        for batch in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, params=batch)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in tag_values(tags).items()]
        for batch in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(run_id, tags=batch)

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int | None = None) -> None:
        """Numeric, finite values only; others (strings, bools, NaN, inf) are skipped."""
        timestamp = int(time.time() * 1000)
        self._log_metric_rows(run_id, [(metrics, step or 0, timestamp)])

    def log_history(self, run_id: str, rows: list[dict[str, Any]], step_key: str = "epoch") -> None:
        """One metric point per numeric value of each row, at ``step=row[step_key]``. Steps the
        run already holds are not logged again: a resumed run repeats a stage that had finished
        when it was stopped (Ctrl-C during evaluation), and its history would show each epoch
        twice."""
        self._log_new_rows(run_id, rows, step_key, self._logged_steps(run_id, rows, step_key))

    def history_sink(self, run_id: str, step_key: str = "epoch"):
        """``log_history`` for rows that arrive a few at a time (each epoch while training):
        the steps the run holds are read once, then kept here rather than read again for
        every new row."""
        logged: set[int] | None = None

        def log(rows: list[dict[str, Any]]) -> None:
            nonlocal logged
            if logged is None:
                logged = self._logged_steps(run_id, rows, step_key)
            logged |= self._log_new_rows(run_id, rows, step_key, logged)

        return log

    def _log_new_rows(
        self, run_id: str, rows: list[dict[str, Any]], step_key: str, logged: set[int]
    ) -> set[int]:
        """The rows at steps not in ``logged``; returns the steps logged."""
        start = int(time.time() * 1000)
        entries = []
        for index, row in enumerate(rows):
            step = row.get(step_key, index)
            step = int(step) if _metric_value(step) is not None else index
            if step in logged:
                continue
            values = {k: v for k, v in row.items() if k != step_key}
            entries.append((values, step, start + index))
        self._log_metric_rows(run_id, entries)
        return {step for _, step, _ in entries}

    def last_step(self, run_id: str, key: str) -> int:
        """The highest step of ``key`` in the run (0 for a run without it)."""
        return max((int(m.step) for m in self.client.get_metric_history(run_id, key)), default=0)

    def _logged_steps(self, run_id: str, rows: list[dict[str, Any]], step_key: str) -> set[int]:
        """Steps at which the run already has any of the rows' metrics (none for a new run)."""
        if not rows or not self.client.get_run(run_id).data.metrics:
            return set()
        keys = {key for row in rows for key in row if key != step_key}
        return {point.step for key in keys for point in self.client.get_metric_history(run_id, key)}

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

    def download_plots(self, run_id: str, directory: str) -> dict[str, str]:
        """The PNGs ``run_id`` logged under ``plots/``, copied into ``directory``, as
        ``{file name: path}``; empty when it logged none."""
        from mlflow.exceptions import MlflowException

        try:
            local = self.client.download_artifacts(run_id, "plots", directory)
        except MlflowException:  # no plots/ in that run
            return {}
        return {
            name: os.path.join(local, name)
            for name in sorted(os.listdir(local))
            if name.endswith(".png")
        }

    def log_figure(self, run_id: str, fig_path: str, artifact_file: str) -> None:
        """Log an image file already written (see training.report) as ``artifact_file``."""
        directory, name = os.path.split(artifact_file)
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, name)
            shutil.copyfile(fig_path, target)
            self.client.log_artifact(run_id, target, directory or None)
