"""What each sweep trial reserves in Ray: a CPU, and with ``train.use_gpu`` a GPU share.

A function of the config and the cluster's total resources (``ray.cluster_resources()``, read
by the sweep when it starts), so it is tested without Ray. The config validator cannot know
whether the cluster has GPUs (it runs before anything starts); the sweep can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from training.config import PipelineConfig
from training.errors import ConfigError

# A trial that drives a TorchTrainer only waits on it; its workers hold the CPUs and GPUs.
# (tune.with_resources refuses {"cpu": 0}.)
TRAINER_DRIVER_CPU = 0.01


@dataclass(frozen=True)
class TrialResources:
    """``trial``: the argument of ``tune.with_resources`` (the trial's own process).
    ``worker``: each TorchTrainer worker's resources (:func:`drives_trainer`), else None."""

    trial: dict[str, float]
    worker: dict[str, float] | None = None


def drives_trainer(config: PipelineConfig) -> bool:
    """Whether each trial drives a TorchTrainer (Tune over Train) rather than running the loop
    in its own process: with several workers per trial, and always for a user's function or
    LightningModule, whose training is written for Ray Train's worker (its dataset shards,
    reports and checkpoints)."""
    return config.sweep.workers_per_trial > 1 or config.train.epochs_from_reports


def trial_resources(config: PipelineConfig, cluster: Mapping[str, float]) -> TrialResources:
    """The resources of one sweep trial, given the cluster's totals (``{"CPU": 4, "GPU": 1}``).

    Function trials (workers_per_trial == 1) take one CPU and, with use_gpu,
    ``sweep.gpus_per_trial`` GPUs (a share: several trials on one GPU). TorchTrainer trials
    take a sliver of CPU for the trial and give each worker ``train.resources_per_worker``
    plus, with use_gpu, ``sweep.gpus_per_trial`` whole GPUs.
    """
    train = config.train
    gpus = _gpus(config, cluster) if train.use_gpu else 0.0
    if not drives_trainer(config):
        return TrialResources({"cpu": 1.0, **({"gpu": gpus} if gpus else {})})
    worker = dict(train.resources_per_worker)
    if gpus:
        worker["GPU"] = gpus
    return TrialResources({"cpu": TRAINER_DRIVER_CPU}, worker)


def _gpus(config: PipelineConfig, cluster: Mapping[str, float]) -> float:
    """``sweep.gpus_per_trial``, or 1 where the cluster has a GPU. Given explicitly it is used
    as is (an autoscaler may add GPU nodes once trials ask for them); left unset on a cluster
    without GPUs, no trial could ever start, so that is an error now rather than a hang."""
    if config.sweep.gpus_per_trial is not None:
        return float(config.sweep.gpus_per_trial)
    if float(cluster.get("GPU", 0.0)) >= 1:
        return 1.0
    raise ConfigError(
        f"train.use_gpu is true but the Ray cluster has no GPU (it has "
        f"{_listing(cluster)}); set train.use_gpu=false, or sweep.gpus_per_trial to wait for "
        "GPU nodes an autoscaler adds"
    )


def _listing(cluster: Mapping[str, float]) -> str:
    shown = {k: v for k, v in cluster.items() if k in ("CPU", "GPU", "memory")}
    return ", ".join(f"{v:g} {k}" for k, v in shown.items()) or "no resources"
