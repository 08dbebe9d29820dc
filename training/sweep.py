"""The Ray Tune sweep: search space from config, ASHA, and the two trial backends.

workers_per_trial == 1: a plain Tune function trial runs the loop in-process (a TorchTrainer would
add 15-20 s of start-up per trial on a small machine and nothing else).
workers_per_trial > 1: each trial drives a TorchTrainer (Tune over Train, Ray 2.60's pattern).
Either way the loop is ``training.loop.run_loop``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from training.config import PipelineConfig, SweepConfig, validate_config
from training.errors import TrainflowError
from training.manifest import Manifest
from training.search_space import SearchDomain
from training.storage import StorageLayout

log = logging.getLogger(__name__)

SWEEP_NAME = "sweep"


@dataclass
class TrialSummary:
    trial_id: str
    params: dict[str, Any]
    status: str  # completed | stopped-early | errored
    epochs: int
    metrics: dict[str, float]
    error: str | None = None
    # One row per reported epoch: {"epoch", "train_loss", "val_loss", "val_accuracy"}.
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class SweepOutcome:
    best_trial_id: str | None
    best_params: dict[str, Any]
    best_metric: float | None
    metric: str
    trials: list[TrialSummary] = field(default_factory=list)
    epochs_spent: int = 0
    epochs_budget: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tune_domain(domain: SearchDomain):
    from ray import tune

    if domain.loguniform is not None:
        return tune.loguniform(*domain.loguniform)
    if domain.uniform is not None:
        return tune.uniform(*domain.uniform)
    if domain.randint is not None:
        return tune.randint(*domain.randint)
    return tune.choice(list(domain.choice))


def param_space(sweep: SweepConfig) -> dict[str, Any]:
    """Flat dict of dotted config paths -> Tune domains (the same keys land in MLflow params)."""
    return {key: tune_domain(domain) for key, domain in sweep.search_space.items()}


def _function_trial(params: dict[str, Any], *, base: dict, spec: dict, arrays, max_epochs: int):
    import torch

    from training.loop import TuneContext, loop_config, run_loop
    from training.manifest import FeatureSpec

    torch.set_num_threads(1)  # one CPU per trial: more threads only fight each other
    config = validate_config(base).with_overrides(params)
    (train_x, train_y), (val_x, val_y) = arrays
    ctx = TuneContext(
        train=(torch.from_numpy(train_x), torch.from_numpy(train_y)),
        val=(torch.from_numpy(val_x), torch.from_numpy(val_y)),
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

    from training.trainer import build_trainer

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
                callbacks=callbacks or [],
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                verbose=0,
            ),
        )
    grid = tuner.fit()
    return summarize(grid, config)


def summarize(grid, config: PipelineConfig) -> SweepOutcome:
    """Each trial's fate, and the best healthy trial (errored trials can never win)."""
    sweep = config.sweep
    keys = list(sweep.search_space)
    trials: list[TrialSummary] = []
    for result in grid:
        metrics = result.metrics or {}
        epochs = int(metrics.get("training_iteration", 0) or 0)
        if result.error is not None:
            status = "errored"
        elif epochs < sweep.asha.max_t:
            status = "stopped-early"
        else:
            status = "completed"
        trials.append(
            TrialSummary(
                trial_id=str(metrics.get("trial_id") or result.path.rsplit("/", 1)[-1]),
                params={k: (result.config or {}).get(k) for k in keys},
                status=status,
                epochs=epochs,
                metrics={
                    k: float(metrics[k])
                    for k in ("train_loss", "val_loss", "val_accuracy")
                    if isinstance(metrics.get(k), int | float)
                },
                error=_first_line(result.error) if result.error is not None else None,
                history=_history(result),
            )
        )
    healthy = [t for t in trials if t.status != "errored" and sweep.metric in t.metrics]
    outcome = SweepOutcome(
        best_trial_id=None,
        best_params={},
        best_metric=None,
        metric=sweep.metric,
        trials=trials,
        epochs_spent=sum(t.epochs for t in trials),
        epochs_budget=sweep.num_samples * sweep.asha.max_t,
    )
    if not healthy:
        reasons = "; ".join(sorted({t.error or "no metrics" for t in trials}))[:500]
        raise TrainflowError(
            f"all {len(trials)} sweep trials failed ({reasons}); fix the cause above or narrow "
            "sweep.search_space"
        )
    sign = 1 if sweep.mode == "max" else -1
    best = max(healthy, key=lambda t: sign * t.metrics[sweep.metric])
    outcome.best_trial_id = best.trial_id
    outcome.best_params = best.params
    outcome.best_metric = best.metrics[sweep.metric]
    return outcome


_HISTORY_KEYS = ("train_loss", "val_loss", "val_accuracy")


def _history(result) -> list[dict[str, float]]:
    """Per-epoch metrics of a trial from its progress file (``result.metrics_dataframe``):
    one row per ``training_iteration`` (the last wins, should a resumed trial repeat one)."""
    frame = getattr(result, "metrics_dataframe", None)
    if frame is None or "training_iteration" not in frame:
        return []
    rows: dict[int, dict[str, float]] = {}
    for record in frame.to_dict("records"):
        try:
            epoch = int(record["training_iteration"])
        except (TypeError, ValueError):
            continue
        row: dict[str, float] = {"epoch": epoch}
        for key in _HISTORY_KEYS:
            value = record.get(key)
            if isinstance(value, int | float) and value == value:  # not NaN
                row[key] = float(value)
        rows[epoch] = row
    return [rows[epoch] for epoch in sorted(rows)]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    # Ray wraps worker errors; the last line usually holds the original message.
    lines = [line for line in text if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:300]
