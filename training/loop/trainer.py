"""The one place a TorchTrainer is built, and the final training run."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from training.config import PipelineConfig
from training.errors import FunctionContractError, TrainflowError
from training.loop.failures import training_error
from training.loop.ingest import in_memory_splits, ingest_options, training_datasets
from training.loop.loop import loop_config, train_worker
from training.loop.records import unpack
from training.manifest import Manifest
from training.platform import cluster, signals
from training.storage import StorageLayout


@functools.cache
def _lean_torch_trainer():
    """Ray's TorchTrainer, less two helper actors where they have nothing to do.

    Each fit starts, beside its controller and workers, a dataset manager (even with no
    datasets) and a detached placement-group cleaner (which polls the State API every second):
    two more processes importing Ray on a 2-core machine while the workers import torch.
    - No datasets (in-memory splits): the manager would serve nothing.
    - A fit driven by the process that started the local instance: the cleaner removes the
      placement group of a controller that died while Ray lives on; here the instance ends with
      this process. A Tune trial's fit keeps it: ASHA kills the trial's actor, and with it the
      controller it owns, while the instance runs on.
    """
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )

    class LeanTorchTrainer(TorchTrainer):
        def _create_default_callbacks(self):
            import ray

            unneeded = []
            if not self.datasets:
                unneeded.append(DatasetsCallback)
            if (
                cluster.started_local_instance()
                and ray.get_runtime_context().get_actor_id() is None  # the driver, no trial
            ):
                unneeded.append(PlacementGroupCleanerCallback)
            return [
                callback
                for callback in super()._create_default_callbacks()
                if not isinstance(callback, tuple(unneeded))
            ]

    return LeanTorchTrainer


@dataclass
class TrainOutcome:
    """What the final training left: the best checkpoint, the per-epoch history, and the
    step validations and profile (``train.eval_every_steps``, ``train.profile``)."""

    checkpoint_path: str
    checkpoint_metrics: dict[str, Any]
    history: list[dict[str, float]]
    run_path: str
    step_metrics: list[dict[str, float]] = field(default_factory=list)
    profile: dict[str, Any] | None = None
    #: The Ray Dashboard the training could be watched in, and whether it is still served
    #: after the run (an existing cluster's; a local instance's stops with the run).
    dashboard: str | None = None
    dashboard_outlives_run: bool = False
    #: Every checkpoint Ray Train kept (``train.checkpoint.num_to_keep``): (path, its metrics).
    kept_checkpoints: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def build_trainer(
    config: PipelineConfig,
    manifest: Manifest,
    *,
    name: str,
    storage_path: str,
    storage_filesystem=None,
    max_epochs: int | None = None,
    num_workers: int | tuple[int, int] | None = None,
    callbacks: list | None = None,
    train_fn=train_worker,
    every_n_batches: int = 0,
    final: bool = False,
    wrap_worker=None,
):
    """A TorchTrainer from config: scaling, run, checkpoint and failure settings in one place.

    ``train_fn``: the per-worker loop (tests wrap it to inject faults). ``final``: step
    validations and the profile as configured (``loop_config``). ``wrap_worker``: wraps the
    engine's worker (the train stage's system-metrics sampler)."""
    import ray.train

    train_fn = _engine_worker(config, train_fn)
    if wrap_worker is not None:
        train_fn = wrap_worker(train_fn)
    train = config.train
    workers = num_workers if num_workers is not None else train.num_workers
    # (min, max): Train V2's elastic policy starts with what fits and resizes within the bounds.
    workers = workers if isinstance(workers, int) else (int(workers[0]), int(workers[1]))
    max_workers = workers if isinstance(workers, int) else workers[1]
    ingest = ingest_options()
    settings = _engine_settings(
        config,
        manifest,
        max_epochs or train.max_epochs,
        every_n_batches=every_n_batches,
        max_workers=max_workers,
        final=final,
    )
    fewest_workers = workers if isinstance(workers, int) else workers[0]
    splits = in_memory_splits(config, manifest, fewest_workers)
    if splits is not None:
        settings["in_memory_splits"] = splits
        datasets = None
    else:
        datasets = training_datasets(
            manifest, config.storage.endpoint_url, materialize=cluster.is_single_node()
        )
    return _lean_torch_trainer()(
        train_fn,
        train_loop_config=settings,
        dataset_config=ray.train.DataConfig(execution_options=ingest),
        scaling_config=_scaling_config(train, workers),
        torch_config=cluster.torch_config(train.torch_backend, train.timeout_s),
        # On several nodes the cached blocks may sit on a node that dies; Train's dataset
        # manager only borrows them, so Ray cannot rebuild them and every restart fails
        # (OBJECT_UNRECONSTRUCTABLE_BORROWED). Streaming from storage survives node loss.
        datasets=datasets,
        run_config=_run_config(train, name, storage_path, storage_filesystem, callbacks),
    )


def _engine_worker(config: PipelineConfig, train_fn):
    """``train_fn``, or the engine's worker in the loop's place: a transformers Trainer
    (``hf_trainer``), the user's function (``function``) or a Lightning Trainer of the user's
    module (``lightning``). A test's or benchmark's own ``train_fn`` is kept."""
    if train_fn is not train_worker:
        return train_fn
    if config.train.engine == "hf_trainer":
        from training.loop.hf_trainer import hf_trainer_worker

        return hf_trainer_worker
    if config.train.engine == "function":
        from training.loop.function_engine import function_worker

        return function_worker
    if config.train.engine == "lightning":
        from training.loop.lightning_engine import lightning_worker

        return lightning_worker
    return train_fn


def _engine_settings(
    config: PipelineConfig, manifest: Manifest, max_epochs: int, **loop_options
) -> dict[str, Any]:
    """The workers' ``train_loop_config``: the loop's settings, a user function's path and
    the plain ``config`` dict it is called with, or what a Lightning worker builds from."""
    if config.train.engine == "function":
        from training.loop.function_engine import function_settings

        return function_settings(config, manifest.spec, max_epochs)
    if config.train.engine == "lightning":
        from training.loop.lightning_engine import lightning_settings

        return lightning_settings(config, manifest.spec, max_epochs)
    return loop_config(config, manifest.spec, max_epochs, split_rows=manifest.rows, **loop_options)


def function_callbacks(config: PipelineConfig) -> list:
    """With ``train.engine: function`` or ``lightning``, the check of every report the user's
    code makes: it must carry ``sweep.metric`` (what ASHA ranks) and
    ``train.checkpoint.score_attribute`` (what the checkpoints are kept by). Nothing for the
    other engines."""
    required = [config.sweep.metric, config.train.checkpoint.score_attribute]
    if config.train.engine == "lightning":
        from training.loop.lightning_engine import LoggedMetricsContract

        return [LoggedMetricsContract(str(config.model.factory), required)]
    if config.train.engine != "function":
        return []
    from training.loop.function_reports import ReportContract

    return [ReportContract(str(config.train.function), required)]


def _scaling_config(train, workers: int | tuple[int, int]):
    """Workers (a number, or (min, max) for Train V2's elastic policy), devices and placement."""
    import ray.train

    return ray.train.ScalingConfig(
        num_workers=workers,
        use_gpu=train.use_gpu,
        resources_per_worker=dict(train.resources_per_worker),
        placement_strategy=train.placement_strategy,
        elastic_resize_monitor_interval_s=train.elastic_resize_interval_s,
    )


def _run_config(train, name: str, storage_path: str, storage_filesystem, callbacks):
    """A deterministic name under the run's storage (a re-run with the same run id resumes),
    checkpoint retention by the configured score, and Ray Train's worker restarts."""
    import ray.train

    return ray.train.RunConfig(
        name=name,
        storage_path=storage_path,
        storage_filesystem=storage_filesystem,
        checkpoint_config=ray.train.CheckpointConfig(
            num_to_keep=train.checkpoint.num_to_keep,
            checkpoint_score_attribute=train.checkpoint.score_attribute,
            checkpoint_score_order=train.checkpoint.score_order,
        ),
        failure_config=ray.train.FailureConfig(max_failures=train.max_failures),
        callbacks=callbacks or [],
    )


def train_final(
    config: PipelineConfig,
    manifest: Manifest,
    run_id: str,
    layout: StorageLayout,
    train_fn=train_worker,
    on_epochs=None,
    epochs_done: int = 0,
    wrap_worker=None,
) -> TrainOutcome:
    """DDP training with the chosen hyperparameters; returns the best checkpoint.
    ``on_epochs`` gets the epochs' rows while training, once a checkpoint holds them;
    ``epochs_done``: what a resumed run's train run holds (a user's function or Lightning
    module reports without trainflow's epoch number); ``wrap_worker``: see ``build_trainer``."""
    from ray.train import TrainingFailedError

    from training.loop.function_reports import ReportHistory
    from training.loop.progress import training_progress

    storage_path, storage_fs = layout.ray_storage(run_id)
    metric = config.train.checkpoint.score_attribute
    recorded = ReportHistory(epochs_done) if config.train.epochs_from_reports else None
    dashboard = cluster.dashboard_url()
    with training_progress(
        config.train.max_epochs,
        metric,
        history=recorded,
        dashboard=dashboard,
        workers=_workers_shown(config.train.num_workers),
        on_epochs=on_epochs,
    ) as callbacks:
        trainer = build_trainer(
            config,
            manifest,
            name="train",
            storage_path=storage_path,
            storage_filesystem=storage_fs,
            # The contract first: a broken report stops before it is forwarded.
            callbacks=[*function_callbacks(config), *callbacks],
            train_fn=train_fn,
            every_n_batches=config.train.checkpoint.every_n_batches,
            final=True,
            wrap_worker=wrap_worker,
        )
        try:
            with signals.handlers_restored(), signals.sigterm_stops_ray_calls():
                result = trainer.fit()
        except TrainingFailedError as exc:
            signals.stop_if_received()  # an interrupted fit is no failure
            raise training_error(exc, config, storage_path) from exc
        signals.stop_if_received()
    best = result.get_best_checkpoint(
        metric=config.train.checkpoint.score_attribute, mode=config.train.checkpoint.score_order
    )
    if best is None and recorded is not None:
        raise function_without_checkpoint(config, reported=bool(recorded.epochs))
    if best is None:
        raise TrainflowError("training finished without a checkpoint; check the worker logs")
    kept = [(c.path, _numbered(m, recorded)) for c, m in result.best_checkpoints or []]
    best_metrics = next((m for path, m in kept if path == best.path), {})
    history, step_metrics, profile = unpack(result.return_value)
    return TrainOutcome(
        checkpoint_path=layout.uri_of(best.path),
        checkpoint_metrics=dict(best_metrics),
        kept_checkpoints=[(layout.uri_of(path), metrics) for path, metrics in kept],
        history=recorded.epochs if recorded is not None else history,
        run_path=layout.uri_of(result.path),
        step_metrics=step_metrics,
        profile=profile,
        dashboard=dashboard,
        dashboard_outlives_run=not cluster.started_local_instance(),
    )


def _numbered(metrics: dict[str, Any], recorded) -> dict[str, Any]:
    """A checkpoint's metrics with its epoch as the train run numbers it (a user's function or
    LightningModule reports its own count, or none)."""
    if recorded is None:
        return dict(metrics)
    metrics = {k: v for k, v in metrics.items() if k != "epoch"}
    epoch = recorded.epoch_of(metrics)
    return {**metrics, **({"epoch": epoch} if epoch is not None else {})}


def _workers_shown(workers: int | tuple[int, int]) -> str:
    return str(workers) if isinstance(workers, int) else f"{workers[0]}-{workers[1]}"


def function_without_checkpoint(config: PipelineConfig, reported: bool) -> FunctionContractError:
    """A user's function that ended without a checkpoint: it never reported, or never
    attached one. (A LightningModule's Trainer ended before its first epoch did.)"""
    from training.loop.function_reports import CONTRACT, MODEL_FILE

    if config.train.engine == "lightning":
        return FunctionContractError(
            f"the LightningModule of model.factory {config.model.factory!r} finished without "
            "completing an epoch, so Ray's report callback reported nothing: check that the "
            f"train split has rows and the module does not stop the Trainer; see {CONTRACT}"
        )
    what = "reported no checkpoint" if reported else "never called ray.train.report"
    return FunctionContractError(
        f"train.function {config.train.function!r} {what}: report once per epoch with the "
        f"metrics and, from rank 0, a checkpoint directory holding {MODEL_FILE}; see {CONTRACT}"
    )
