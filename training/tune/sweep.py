"""The Ray Tune sweep: one Tuner with ASHA (resumed with the run id), and its two trial backends.

workers_per_trial == 1: a plain Tune function trial runs the loop in-process (a TorchTrainer would
add 15-20 s of start-up per trial on a small machine and nothing else).
workers_per_trial > 1: each trial drives a TorchTrainer (Tune over Train, Ray 2.60's pattern).
Either way the loop is ``training.loop.loop.run_loop``. A user's function
(``train.engine: function``) or LightningModule (``lightning``) always runs in a TorchTrainer
trial: it is written for Ray Train's worker.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from training import progress
from training.config import PipelineConfig, SweepConfig, validate_config
from training.errors import TrainflowError
from training.manifest import FeatureSpec, Manifest
from training.platform import signals
from training.storage import StorageLayout
from training.tune.outcome import SweepOutcome, summarize
from training.tune.resources import drives_trainer, trial_resources
from training.tune.space import param_space

log = logging.getLogger(__name__)

SWEEP_NAME = "sweep"


def _function_trial(params: dict[str, Any], *, base: dict, spec: dict, arrays, max_epochs: int):
    import torch

    from training.loop.contexts import TuneContext
    from training.loop.loop import loop_config, run_loop

    torch.set_num_threads(1)  # one CPU per trial: more threads only fight each other
    config = validate_config(base).with_overrides(params)
    # The arrays come read-only from the object store (shared by every trial on the node);
    # torch has no read-only tensors, so each trial takes its own copy.
    (train_x, train_y), (val_x, val_y) = arrays
    ctx = TuneContext(
        train=(torch.tensor(train_x), torch.tensor(train_y)),
        val=(torch.tensor(val_x), torch.tensor(val_y)),
        seed=config.train.seed,
        device=_trial_device(config),
    )
    rows = {"train": len(train_y)}  # sizes the LR warm-up (train.warmup_ratio)
    run_loop(loop_config(config, FeatureSpec.from_dict(spec), max_epochs, split_rows=rows), ctx)


def _trial_device(config: PipelineConfig) -> str:
    """The trial's GPU share with use_gpu (Ray sets CUDA_VISIBLE_DEVICES to it), else the CPU."""
    import torch

    if not config.train.use_gpu:
        return "cpu"
    if not torch.cuda.is_available():
        raise TrainflowError(
            "train.use_gpu is true but this trial's torch sees no CUDA device (a CPU build of "
            f"torch {torch.__version__}?); install a CUDA build on the GPU nodes or set "
            "train.use_gpu=false"
        )
    return "cuda"


def _trainer_trial(
    params: dict[str, Any],
    *,
    base: dict,
    manifest_json: str,
    storage_path: str,
    storage_filesystem,
    max_epochs: int,
    workers: int,
):
    import ray.tune
    from ray.train import TrainingFailedError
    from ray.tune.integration.ray_train import TuneReportCallback

    from training.loop.failures import contract_error
    from training.loop.trainer import build_trainer, function_callbacks, function_without_checkpoint

    config = validate_config(base).with_overrides(params)
    trial_id = ray.tune.get_context().get_trial_id()
    trainer = build_trainer(
        config,
        Manifest.from_json(manifest_json),
        name=f"trial-{trial_id}",
        storage_path=storage_path,
        storage_filesystem=storage_filesystem,
        max_epochs=max_epochs,
        num_workers=workers,
        # A function's report is checked before Tune (and ASHA) sees it.
        callbacks=[*function_callbacks(config), TuneReportCallback()],
    )
    try:
        result = trainer.fit()
    except TrainingFailedError as exc:
        broken = contract_error(exc)
        if broken is not None:  # one line for the sweep to end the run with
            raise broken from None
        raise
    if config.train.epochs_from_reports and not result.metrics:
        raise function_without_checkpoint(config, reported=False)


def sample_sizes(
    sweep: SweepConfig, manifest: Manifest, trainer_trials: bool = False
) -> dict[str, int]:
    """Rows of train and val each function trial gets: ``sweep.sample_rows`` of train, fewer if
    their features exceed ``sweep.sample_mb`` (all of a smaller split), and the same fraction of
    val. The final training always takes every row, and so do TorchTrainer trials
    (``workers_per_trial > 1`` or ``trainer_trials``, which stream the splits with Ray Data)."""
    train, val = manifest.rows["train"], manifest.rows["val"]
    limits = [train]
    if sweep.sample_rows is not None:
        limits.append(sweep.sample_rows)
    if sweep.sample_mb is not None:
        limits.append(max(1, sweep.sample_mb * 1024**2 // manifest.spec.row_bytes))
    rows = min(limits)
    if rows >= train or trainer_trials or sweep.workers_per_trial > 1:
        return {"train": train, "val": val}
    return {"train": rows, "val": max(1, math.ceil(val * rows / train))}


def _sample_note(config: PipelineConfig, manifest: Manifest) -> str:
    """What the sweep's progress lines add when trials train on a sample."""
    sizes = sample_sizes(config.sweep, manifest, drives_trainer(config))
    used, train = sizes["train"], manifest.rows["train"]
    return f"; trials on {used:,} of {train:,} train rows" if used < train else ""


def _trainable(config: PipelineConfig, manifest: Manifest, storage_path: str, storage_fs):
    import ray
    from ray import tune

    from training.data.read import load_split_arrays

    sweep = config.sweep
    resources = trial_resources(config, ray.cluster_resources())
    if resources.worker is not None:  # each TorchTrainer worker's CPUs and GPUs
        config = config.with_overrides({"train.resources_per_worker": resources.worker})
    base = config.model_dump(mode="json")
    if not drives_trainer(config):
        sizes = sample_sizes(sweep, manifest)
        if sizes["train"] < manifest.rows["train"]:
            progress.report(
                "sweep",
                f"trials train on a sample of {sizes['train']:,} of {manifest.rows['train']:,} "
                f"train rows (sweep.sample_rows, sweep.sample_mb) and validate on "
                f"{sizes['val']:,}; the final "
                "training uses every row",
                sample_rows=sizes["train"],
            )
        arrays = tuple(
            load_split_arrays(
                manifest,
                split,
                config.storage.endpoint_url,
                sample_rows=sizes[split],
                seed=sweep.seed,
            )[:2]
            for split in ("train", "val")
        )
        # with_parameters puts the arrays in the object store once for all trials.
        fn = tune.with_parameters(
            _function_trial,
            base=base,
            spec=manifest.spec.to_dict(),
            arrays=arrays,
            max_epochs=sweep.asha.max_t,
        )
        return tune.with_resources(fn, resources.trial)
    fn = tune.with_parameters(
        _trainer_trial,
        base=base,
        manifest_json=manifest.to_json(),
        storage_path=storage_path,
        storage_filesystem=storage_fs,
        max_epochs=sweep.asha.max_t,
        workers=sweep.workers_per_trial,
    )
    # The trial only drives the TorchTrainer; its workers hold the CPUs (and GPUs).
    return tune.with_resources(fn, resources.trial)


def build_searcher(sweep: SweepConfig):
    """The sweep's search algorithm (``sweep.searcher``), running at most
    ``sweep.max_concurrent_trials`` trials at once.

    random: Tune's BasicVariantGenerator, which limits concurrency itself (TuneConfig's limit
    only wraps Searchers). optuna: Optuna's TPE through Tune's OptunaSearch, which takes the
    param_space's Tune domains as they are (loguniform/uniform -> FloatDistribution, randint
    -> IntDistribution with the high end exclusive, choice -> CategoricalDistribution), in a
    ConcurrencyLimiter. Tune saves either in the experiment directory, so Tuner.restore goes
    on with the same generator or study.
    """
    if sweep.searcher == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        return BasicVariantGenerator(
            random_state=sweep.seed, max_concurrent=sweep.max_concurrent_trials
        )
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    # Optuna logs each study it creates at INFO; the sweep's own progress events say enough.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(
        seed=sweep.seed,
        # Optuna's default waits for 10 random trials before TPE models anything: more than a
        # whole sweep of 8. Half the budget (2 to 10) explores at random, the rest exploits.
        n_startup_trials=max(2, min(10, sweep.num_samples // 2)),
    )
    return ConcurrencyLimiter(OptunaSearch(sampler=sampler), sweep.max_concurrent_trials)


def run_sweep(
    config: PipelineConfig,
    manifest: Manifest,
    run_id: str,
    layout: StorageLayout,
    callbacks: list | None = None,
) -> SweepOutcome:
    """Run (or resume, with the same run id) the ASHA sweep and pick the best healthy trial."""
    from ray import tune

    storage_path, storage_fs = layout.ray_storage(run_id)
    trainable = _trainable(config, manifest, storage_path, storage_fs)
    experiment_path = f"{storage_path.rstrip('/')}/{SWEEP_NAME}"
    if tune.Tuner.can_restore(experiment_path, storage_filesystem=storage_fs):
        # Restored as first stored: trials, space and searcher state (random or optuna).
        log.info("resuming the sweep stored at %s", experiment_path)
        tuner = tune.Tuner.restore(
            experiment_path,
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
            storage_filesystem=storage_fs,
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space(config.sweep),
            tune_config=_tune_config(config.sweep, reuse_actors=not drives_trainer(config)),
            run_config=tune.RunConfig(
                name=SWEEP_NAME,
                storage_path=storage_path,
                storage_filesystem=storage_fs,
                callbacks=[*(callbacks or []), _progress(config, manifest)],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                verbose=0,
            ),
        )
    with signals.sigterm_stops_ray_calls():
        grid = tuner.fit()
    signals.stop_if_received()  # a signal during fit() may leave it returning a partial grid
    return summarize(grid, config)


def _tune_config(sweep: SweepConfig, reuse_actors: bool):
    """The metric, the samples, the searcher and ASHA over epochs (one report per epoch)."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    return tune.TuneConfig(
        metric=sweep.metric,
        mode=sweep.mode,
        num_samples=sweep.num_samples,
        search_alg=build_searcher(sweep),
        scheduler=ASHAScheduler(
            time_attr="training_iteration",
            max_t=sweep.asha.max_t,
            grace_period=sweep.asha.grace_period,
            reduction_factor=sweep.asha.reduction_factor,
        ),
        # A new function trial reuses a finished trial's process: 1.5-3 s of Python and
        # torch start-up saved per trial (benchmark B6). Not for trials that drive a
        # TorchTrainer: a second fit() in the same trial process hangs in Ray 2.60.
        reuse_actors=reuse_actors,
    )


def _progress(config: PipelineConfig, manifest: Manifest):
    """The console's sweep line: trials finished, stopped early, running, the best so far."""
    from training.tune.progress import SweepProgress

    sweep = config.sweep
    return SweepProgress(
        sweep.metric,
        sweep.mode,
        sweep.num_samples,
        sweep.asha.max_t,
        sample=_sample_note(config, manifest),
    )
