"""Stage 1: the input files resolved and fingerprinted, preprocessed once per fingerprint, and
the outcome recorded on the pipeline's parent run."""

from __future__ import annotations

from dataclasses import dataclass

from training import progress
from training.config import PipelineConfig
from training.data import inputs
from training.data import preprocess as preprocessing
from training.data.roles import role_line
from training.manifest import Manifest
from training.model.trainflow_pyfunc.prompts import described
from training.stages import drift_check, preflight
from training.stages.connect import connect_ray
from training.storage import StorageLayout
from training.tracking.runs import Tracker


@dataclass(frozen=True)
class DataInputs:
    """The input files and the fingerprint of their bytes with the preprocessing config."""

    files: list[str]
    fingerprint: str


@dataclass(frozen=True)
class Prepared:
    """The preprocessed data, whether an earlier run's output was reused, the config whose
    metrics follow the data's task, and the drift from the champion's training data (a
    ``DriftReport`` as a dict; None: nothing to compare) for the gate."""

    manifest: Manifest
    cached: bool
    config: PipelineConfig
    drift: dict | None = None


def inspect_data(config: PipelineConfig) -> DataInputs:
    """Resolve the input files and fingerprint them with the preprocessing config."""
    endpoint = config.storage.endpoint_url
    files = inputs.resolve_inputs(config.data, endpoint, StorageLayout.from_config(config).root)
    fingerprint = inputs.fingerprint(config.data, files, endpoint, config.model)
    preflight.check_model(config, files, fingerprint)  # a custom model: checked before Ray
    return DataInputs(files, fingerprint)


def preprocess(config: PipelineConfig, fingerprint: str, files: list[str]) -> Manifest:
    """Read, validate, split, fit the transform on train, write the splits (Ray Data)."""
    connect_ray(config)
    return preprocessing.preprocess(config, StorageLayout.from_config(config), fingerprint, files)


def _columns_text(manifest: Manifest) -> str:
    """``; columns: 4 numeric (a, b, c, d), 1 id-like ignored (order_id) ('order_id' not
    used: id-like ...)``: every column's role on the preprocess line with its columns (the
    first few of each role), each one not used named with its reason, each string column
    found datetime with its format, each found text with why."""
    roles = manifest.spec.column_roles
    if not roles:
        return ""
    notes = [f"{c!r} datetime ({how})" for c, how in manifest.spec.datetime_found.items()]
    # Long free text is text as anyone expects; short text (names, titles) is said with why.
    found = manifest.spec.text_found.items()
    notes += [f"{c!r} text ({why})" for c, why in found if why.startswith("short text")]
    notes += [f"{c!r} not used: {r}" for c, r in manifest.ignored_columns.items()]
    detail = "; ".join(notes)
    used = role_line(roles)
    if manifest.spec.tokens:  # a text model reads its text column alone
        used = f"{described(manifest.spec.tokens)} as tokens"
    return f"; columns: {used}" + (f" ({detail})" if detail else "")


def _dropped_text(manifest: Manifest) -> str:
    """`` (12 without a label dropped, the first in /d/t.csv (row 3 of the file))``, or ""."""
    if not manifest.rows_dropped_unlabeled:
        return ""
    first = f", the first in {manifest.first_unlabeled}" if manifest.first_unlabeled else ""
    return f" ({manifest.rows_dropped_unlabeled:,} without a label dropped{first})"


def _dropped_tags(manifest: Manifest) -> dict[str, str]:
    """The rows left out for having no label, on the run: the data trained on is not the file."""
    tags = {"data.rows_dropped_unlabeled": str(manifest.rows_dropped_unlabeled)}
    if manifest.first_unlabeled:
        tags["data.first_unlabeled_row"] = manifest.first_unlabeled
    return tags


def record(
    config: PipelineConfig, tracker: Tracker, parent_run: str, manifest: Manifest, cached: bool
) -> Prepared:
    """Tag the parent run with the data and its task, log the manifest, report the rows, and
    measure the drift from the champion's training data.

    Run whether the preprocessing ran or was reused, so it sits apart from :func:`preprocess`.
    """
    spec = manifest.spec
    tracker.set_tags(
        parent_run,
        {
            "data_fingerprint": manifest.fingerprint,
            "preprocess_cached": cached,
            "trainflow.task": spec.task,
            "trainflow.task_reason": manifest.task_reason or f"data.task={spec.task}",
            **{f"trainflow.column.{c}": r for c, r in spec.column_roles.items()},
        },
    )
    tracker.log_text(parent_run, manifest.to_json(), "manifest.json")
    if manifest.rows_dropped_unlabeled:
        tracker.set_tags(parent_run, _dropped_tags(manifest))
    progress.report(
        "preprocess",
        f"{sum(manifest.rows.values()):,} rows{_dropped_text(manifest)}"
        f"{_columns_text(manifest)}; task: {spec.task} ({manifest.task_reason or 'data.task'})",
        task=spec.task,
    )
    # The metrics the sweep ranks, checkpoints keep and the gate compares follow the task.
    # (a regression's are its RMSE where the config names accuracy: metrics.follow_task)
    drift = drift_check.measure(config, tracker, parent_run, manifest)
    return Prepared(
        manifest,
        cached,
        config.with_overrides({"data.task": spec.task}),
        drift.to_dict() if drift is not None else None,
    )
