"""One Prefect task per stage: the decorator (retries, cache policy) and one call into
``training.stages``, where the stage's work and its MLflow bookkeeping live."""

from __future__ import annotations

import hashlib
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.policy import STAGE_TASK_OPTIONS
from training.config import PipelineConfig
from training.manifest import Manifest
from training.stages import evaluate as evaluate_stage
from training.stages import preprocess as preprocess_stage
from training.stages import promote as promote_stage
from training.stages import sweep as sweep_stage
from training.stages import train as train_stage
from training.stages.blips import tracking_blips
from training.stages.evaluated import Evaluated
from training.stages.preprocess import DataInputs
from training.stages.train import Trained
from training.storage import StorageLayout
from training.summary import ModelSummary
from training.tune.outcome import SweepOutcome


@task(name="inspect-data", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def inspect_data(config: PipelineConfig) -> DataInputs:
    return preprocess_stage.inspect_data(config)


def _preprocess_cache_key(context, parameters: dict[str, Any]) -> str:
    # Same input bytes + same preprocessing config + same storage = same output: reuse it.
    layout = StorageLayout.from_config(parameters["config"])
    where = hashlib.sha256(layout.data_dir(parameters["fingerprint"]).encode()).hexdigest()[:12]
    return f"preprocess-{parameters['fingerprint']}-{where}"


@task(
    name="preprocess",
    cache_key_fn=_preprocess_cache_key,
    persist_result=True,
    **STAGE_TASK_OPTIONS,
)
def preprocess(config: PipelineConfig, fingerprint: str, files: list[str]) -> Manifest:
    with tracking_blips(config, "preprocess"):
        return preprocess_stage.preprocess(config, fingerprint, files)


@task(name="sweep", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def sweep(config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str) -> SweepOutcome:
    with tracking_blips(config, "sweep"):
        return sweep_stage.sweep(config, manifest, run_id, parent_run)


@task(name="train", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def train(config: PipelineConfig, manifest: Manifest, run_id: str, parent_run: str) -> Trained:
    with tracking_blips(config, "train"):
        return train_stage.train(config, manifest, run_id, parent_run)


@task(name="evaluate", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def evaluate(
    config: PipelineConfig, manifest: Manifest, checkpoint_path: str, parent_run: str
) -> Evaluated:
    with tracking_blips(config, "evaluate"):
        return evaluate_stage.evaluate(config, manifest, checkpoint_path, parent_run)


@task(name="promote", cache_policy=NO_CACHE, **STAGE_TASK_OPTIONS)
def promote(
    config: PipelineConfig,
    manifest: Manifest,
    trained: Trained,
    evaluated: Evaluated,
    parent_run: str,
    sweep: SweepOutcome | None = None,
    run_id: str | None = None,
    drift: dict | None = None,
) -> ModelSummary:
    with tracking_blips(config, "promote"):
        return promote_stage.promote(
            config, manifest, trained, evaluated, parent_run, sweep, run_id, drift
        )
