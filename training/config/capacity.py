"""Whether a configuration's workers fit the local Ray instance (checked with the config)."""

from __future__ import annotations


def check_fits_local_instance(train, sweep, ray) -> None:
    """ValueError naming the keys when training or a sweep trial needs more CPUs than
    ``ray.num_cpus`` gives the local instance."""
    cpus_per_worker = train.resources_per_worker.get("CPU", 1.0)
    needed = train.min_workers * cpus_per_worker
    if needed > ray.num_cpus:
        raise ValueError(
            f"train.num_workers={train.num_workers} x {cpus_per_worker} CPU needs "
            f"{needed:g} CPUs but the local Ray instance has ray.num_cpus={ray.num_cpus}; "
            "lower train.num_workers or raise ray.num_cpus"
        )
    per_trial = sweep.workers_per_trial * cpus_per_worker
    if sweep.enabled and per_trial > ray.num_cpus:
        raise ValueError(
            f"sweep.workers_per_trial={sweep.workers_per_trial} needs {per_trial:g} CPUs "
            f"but ray.num_cpus={ray.num_cpus}; lower it or raise ray.num_cpus"
        )
