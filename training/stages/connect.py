"""The Ray connection every Ray stage starts with."""

from __future__ import annotations

from training.config import PipelineConfig
from training.model import factory
from training.platform import cluster
from training.storage import StorageLayout


def connect_ray(config: PipelineConfig) -> dict[str, float]:
    """Idempotent: a retried task finds Ray already running in this process."""
    # A custom model's package and a training function's, unless installed, travel to every
    # worker (py_modules).
    shipped = factory.ship_paths(config.model, config.train.function)
    resources = cluster.connect(config.ray, py_modules=shipped)
    cluster.check_can_host(
        resources, config.train.min_workers, cluster.worker_resources(config.train)
    )
    cluster.check_shared_storage(StorageLayout.from_config(config).root)
    return resources
