"""The Ray Tune sweep: one Tuner with ASHA (resumed with the run id), and its two trial backends.

workers_per_trial == 1: a plain Tune function trial runs the loop in-process (a TorchTrainer would
add 15-20 s of start-up per trial on a small machine and nothing else).
workers_per_trial > 1: each trial drives a TorchTrainer (Tune over Train, Ray 2.60's pattern).
Either way the loop is ``training.loop.loop.run_loop``.
"""

from __future__ import annotations

import logging
from typing import Any

from training.config import PipelineConfig, validate_config
from training.manifest import FeatureSpec, Manifest
from training.storage import StorageLayout
from training.tune.outcome import SweepOutcome, summarize
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
    )
    run_loop(loop_config(config, FeatureSpec.from_dict(spec), max_epochs), ctx)


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
    from ray.tune.integration.ray_train import TuneReportCallback

    from training.loop.trainer import build_trainer

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
        callbacks=[TuneReportCallback()],
    )
    trainer.fit()


def _trainable(config: PipelineConfig, manifest: Manifest, storage_path: str, storage_fs):
    from ray import tune

    from training.data.read import load_split_arrays

    sweep = config.sweep
    base = config.model_dump(mode="json")
    if sweep.workers_per_trial == 1:
        arrays = tuple(
            load_split_arrays(manifest, split, config.storage.endpoint_url)[:2]
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
        return tune.with_resources(fn, {"cpu": 1})
    fn = tune.with_parameters(
        _trainer_trial,
        base=base,
        manifest_json=manifest.to_json(),
        storage_path=storage_path,
        storage_filesystem=storage_fs,
        max_epochs=sweep.asha.max_t,
        workers=sweep.workers_per_trial,
    )
    # The trial only drives the TorchTrainer; its workers hold the CPUs.
    return tune.with_resources(fn, {"cpu": 0.01})


def run_sweep(
    config: PipelineConfig,
    manifest: Manifest,
    run_id: str,
    layout: StorageLayout,
    callbacks: list | None = None,
) -> SweepOutcome:
    """Run (or resume, with the same run id) the ASHA sweep and pick the best healthy trial."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from training.tune.progress import SweepProgress

    sweep = config.sweep
    storage_path, storage_fs = layout.ray_storage(run_id)
    trainable = _trainable(config, manifest, storage_path, storage_fs)
    experiment_path = f"{storage_path.rstrip('/')}/{SWEEP_NAME}"
    if tune.Tuner.can_restore(experiment_path, storage_filesystem=storage_fs):
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
            param_space=param_space(sweep),
            tune_config=tune.TuneConfig(
                metric=sweep.metric,
                mode=sweep.mode,
                num_samples=sweep.num_samples,
                # The generator itself limits concurrency (TuneConfig's limit only wraps Searchers).
                search_alg=BasicVariantGenerator(
                    random_state=sweep.seed, max_concurrent=sweep.max_concurrent_trials
                ),
                scheduler=ASHAScheduler(
                    time_attr="training_iteration",
                    max_t=sweep.asha.max_t,
                    grace_period=sweep.asha.grace_period,
                    reduction_factor=sweep.asha.reduction_factor,
                ),
                # A new function trial reuses a finished trial's process: 1.5-3 s of Python and
                # torch start-up saved per trial (benchmark B6). Not for trials that drive a
                # TorchTrainer: a second fit() in the same trial process hangs in Ray 2.60.
                reuse_actors=sweep.workers_per_trial == 1,
            ),
            run_config=tune.RunConfig(
                name=SWEEP_NAME,
                storage_path=storage_path,
                storage_filesystem=storage_fs,
                callbacks=[
                    *(callbacks or []),
                    SweepProgress(sweep.metric, sweep.mode, sweep.num_samples, sweep.asha.max_t),
                ],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                verbose=0,
            ),
        )
    grid = tuner.fit()
    return summarize(grid, config)
