"""The process and its Ray: connect, shut down, what the cluster can host.

The public face (``training.platform.cluster``, re-exported here) and the process-level helpers
beside it (``signals``, ``probe``, ``secrets``, ``db_templates``). Ray's patches,
environment defaults, the early-start thread and socket-path arithmetic live in ``_internal``.
"""

from training.platform._internal.temp_dir import ray_temp_dir
from training.platform.cluster import (
    check_can_host,
    check_shared_storage,
    connect,
    free_port,
    is_single_node,
    job_runtime_env,
    ray_env,
    shutdown,
    shutdown_soon,
    start_early,
    started_local_instance,
    torch_config,
    worker_resources,
)

__all__ = [
    "check_can_host",
    "check_shared_storage",
    "connect",
    "free_port",
    "is_single_node",
    "job_runtime_env",
    "ray_env",
    "ray_temp_dir",
    "shutdown",
    "shutdown_soon",
    "start_early",
    "started_local_instance",
    "torch_config",
    "worker_resources",
]
