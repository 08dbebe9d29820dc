"""The one ``ray.init``: a local instance (embedded default) or an existing cluster."""

from __future__ import annotations

import logging
import os
import threading

from training.config import RayConfig
from training.errors import ConfigError, ServiceUnreachableError
from training.platform import heap, signals
from training.platform._internal.early_start import EarlyStart
from training.platform._internal.env_defaults import (
    RAY_ENV_DEFAULTS,
    environ_for_local_instance,
    local_instance_env_vars,
)
from training.platform._internal.patches import (
    keep_credentials_out_of_runtime_envs,
    keep_local_instance_on_loopback,
)
from training.platform._internal.temp_dir import ray_temp_dir

log = logging.getLogger(__name__)

# True in the process that started the local instance it is connected to (the driver, which
# also stops it): nothing of that instance outlives this process.
_started_local_instance = False


def started_local_instance() -> bool:
    """True in the driver that started, and will stop, the local Ray instance it uses."""
    import ray

    return _started_local_instance and ray.is_initialized()


# The early start of this process (``start_early``), adopted by the first ``connect``.
_early = EarlyStart()


def start_early(ray_config: RayConfig, py_modules: list[str] | None = None) -> None:
    """Start a local instance in a thread, so that its start (~6 s on 2 cores) runs beside
    the caller's imports and Prefect's start; the first ``connect`` waits for it and raises
    its error, if any. Nothing happens for a cluster address: a cluster is joined as needed."""
    import ray

    # Imported here, before the thread starts: connect() imports Tune (and with it Train and
    # Data, which import one another), and two threads entering circular imports at once can
    # each find the other's modules half-initialised. The pipeline imports them anyway.
    from ray.tune.execution import class_cache  # noqa: F401

    if _early.begun or ray.is_initialized():
        return
    if ray_config.address or os.environ.get("RAY_ADDRESS"):
        return
    _early.begin(lambda: connect(ray_config, py_modules))


def _adopt_early_start(*, raise_error: bool = True) -> None:
    """An early start under way ends first; its instance is then watched for signals from
    this thread, as ``connect`` does."""
    if _early.adopt(raise_error=raise_error):
        signals.watch()


def ray_env() -> dict[str, str]:
    """Environment every Ray process of ours should see (driver and workers)."""
    return dict(RAY_ENV_DEFAULTS)


def job_runtime_env(
    ray_config: RayConfig, address: str | None, py_modules: list[str] | None = None
) -> dict:
    """The job's runtime_env: our env vars, our code when ``ray.ship_code`` is on, and
    ``py_modules`` (a custom model's package that the nodes do not have installed)."""
    env: dict = {"env_vars": ray_env()}
    modules = list(py_modules or [])
    if ray_config.ship_code:
        # Only training/ runs on workers (it never imports prefect): upload it as a module so
        # nodes need the dependencies but not trainflow itself.
        import training

        modules.insert(0, os.path.dirname(os.path.abspath(training.__file__)))
    if modules:
        env["py_modules"] = modules
    if address and "://" not in address:
        # Train V2's placement-group cleaner finds the State API from RAY_ADDRESS; unset, it
        # auto-detects the latest cluster started on that node, which may be another one.
        env["env_vars"]["RAY_ADDRESS"] = address
    return env


def connect(ray_config: RayConfig, py_modules: list[str] | None = None) -> dict[str, float]:
    """Start or join Ray once per process (retried Prefect tasks find it running).

    Returns the cluster's total resources.
    """
    global _started_local_instance
    import ray

    _adopt_early_start()
    # The driver reads every summary of the data and the sweep's sample: what it frees of
    # them goes back to the OS rather than staying in its heap for the rest of the run.
    heap.keep_releasing()
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if _stopping is not None:  # a stop begun by `shutdown_soon` ends before anything new
        shutdown()
    if ray.is_initialized():
        return ray.cluster_resources()
    keep_credentials_out_of_runtime_envs()
    address = ray_config.address or os.environ.get("RAY_ADDRESS")
    runtime_env = job_runtime_env(ray_config, address, py_modules)
    try:
        if address:
            keep_local_instance_on_loopback(False)
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        else:
            _start_local_instance(ray_config, runtime_env)
            _started_local_instance = True
            _bound_ray_data_object_store()
        signals.watch()
    except ConnectionError as exc:
        raise ServiceUnreachableError(
            f"cannot connect to the Ray cluster at {address}: {exc}; check ray.address / "
            "RAY_ADDRESS, or unset it to use a local instance"
        ) from None
    return ray.cluster_resources()


def _start_local_instance(ray_config: RayConfig, runtime_env: dict) -> None:
    """``ray.init`` of a new local instance: every port on 127.0.0.1, sessions in the home."""
    import ray

    keep_local_instance_on_loopback(True)
    dashboard_port = free_port()
    # Train V2's placement-group cleaner queries the State API from inside the cluster;
    # without an explicit address it auto-detects, and with two Ray instances on one
    # machine (two runs at once, a test beside a run) it may ask the wrong one.
    runtime_env["env_vars"]["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard_port}"
    runtime_env["env_vars"].update(local_instance_env_vars())
    with environ_for_local_instance(runtime_env):
        ray.init(
            # "local": always a new instance; with no address Ray would join whatever
            # cluster `ray start` last started on this machine.
            address="local",
            num_cpus=ray_config.num_cpus,
            object_store_memory=(
                ray_config.object_store_mb * 1024**2 if ray_config.object_store_mb else None
            ),
            # The dashboard serves the State API that Train V2 uses to clean up placement
            # groups of trials stopped by ASHA; without it later trials hang.
            include_dashboard=True,
            # The dashboard's HTTP API on loopback too (its default is 127.0.0.1 already,
            # said here so that a change of default cannot expose it).
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
            # Sessions (logs, spilled objects) under the trainflow home, not /tmp/ray
            # shared by every Ray on the machine: a run's logs are found, and checked,
            # in one place.
            _temp_dir=str(ray_temp_dir()),
            runtime_env=runtime_env,
            configure_logging=True,
            logging_level=logging.WARNING,
            log_to_driver=True,
        )


# The object store Ray Data may fill, per execution, on a local instance (its default: half the
# store, 30 % of RAM). Every page of the store a process has written stays mapped in it, and
# resident, for the rest of the run: at 8M rows of the mixed table the preprocessing's reads ran
# ahead of the transform and left 540 MB of the store in the memory of two idle workers. The
# largest block is 128 MiB (Ray's target), so a few still fit.
DATA_OBJECT_STORE_BYTES = 512 * 1024**2


def _bound_ray_data_object_store() -> None:
    """Ray Data in this process (preprocessing, and the training ingest, whose options start
    from it) within ``DATA_OBJECT_STORE_BYTES`` of the store, unless a lower limit is set."""
    from ray.data import DataContext

    options = DataContext.get_current().execution_options
    limit = options.resource_limits.object_store_memory
    if limit is None or limit > DATA_OBJECT_STORE_BYTES:
        options.resource_limits = options.resource_limits.copy(
            object_store_memory=DATA_OBJECT_STORE_BYTES
        )


def dashboard_url() -> str | None:
    """The Ray Dashboard of the instance this process is connected to (``http://host:port``):
    the local instance's on 127.0.0.1, or the existing cluster's; None when not connected or
    it runs none. A local instance's stops with the run."""
    import ray

    if not ray.is_initialized():
        return None
    from ray._private import worker

    # Ray's own override (a proxy in front of a cluster's dashboard), else what the node says.
    url = os.environ.get("RAY_OVERRIDE_DASHBOARD_URL") or getattr(
        worker._global_node, "webui_url", None
    )
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free right now (the caller binds it soon after)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_can_host(total: dict[str, float], workers: int, per_worker: dict[str, float]) -> None:
    """Fail before training if the cluster can never host the worker group."""
    for resource, amount in per_worker.items():
        key = resource.upper() if resource.lower() in ("cpu", "gpu") else resource
        have = total.get(key, 0.0)
        if workers * amount > have:
            raise ConfigError(
                f"train.num_workers={workers} x {amount:g} {key} needs {workers * amount:g} {key} "
                f"but the Ray cluster has {have:g}; lower train.num_workers or "
                "train.resources_per_worker, or add nodes"
            )


# The thread `shutdown_soon` started, until `shutdown` has waited for it.
_stopping: threading.Thread | None = None


def shutdown_soon() -> None:
    """Start disconnecting (and stopping a local instance) in a thread, once the last stage that
    uses Ray is done: Ray stops its processes gracefully, one after another (~1.4 s on 2
    cores), while promotion and the report run. `shutdown` waits for it."""
    global _stopping
    import ray

    if _stopping is None and ray.is_initialized():
        # Ray's handles and refs that are garbage already are freed now, while Ray is up: once
        # it is stopped, the core worker quits the process when one is freed (exit 1, no
        # message). Suspected in one CI run that died as promotion began; not reproduced.
        import gc

        gc.collect()
        _stopping = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
        _stopping.start()


def shutdown() -> None:
    """Disconnect from Ray (stopping a local instance); returns once it is done."""
    global _stopping, _started_local_instance
    import ray

    _adopt_early_start(raise_error=False)  # a start under way ends first, then stops
    _started_local_instance = False
    if _stopping is not None:
        _stopping.join()
        _stopping = None
    if ray.is_initialized():
        ray.shutdown()
    _early.end()


def torch_config(backend: str | None, timeout_s: int):
    """Ray Train's TorchConfig for every TorchTrainer of ours: rank 0's rendezvous store listens
    on 127.0.0.1 when the master address is loopback (a local instance); on a cluster it keeps
    the node address, as torch does."""
    from training.platform._internal.loopback_store import LoopbackStoreTorchConfig

    return LoopbackStoreTorchConfig(backend=backend, timeout_s=timeout_s)


def worker_resources(train) -> dict[str, float]:
    """What one training worker reserves: ``resources_per_worker`` plus a GPU with use_gpu."""
    resources = dict(train.resources_per_worker)
    if train.use_gpu:
        resources.setdefault("GPU", 1.0)
    return resources


def check_shared_storage(storage_root: str) -> None:
    """Warn when a multi-node cluster writes checkpoints under a local path.

    Every node must see the storage root (workers upload checkpoints, the driver reads them):
    s3:// always works; a local path only if it is a shared mount (NFS) on every node.
    """
    import ray

    from training.storage import is_remote

    alive = [node for node in ray.nodes() if node.get("Alive")]
    if len(alive) > 1 and not is_remote(storage_root):
        log.warning(
            "storage.root %s is a local path but the Ray cluster has %d nodes: it must be a "
            "shared mount on every node; set storage.root to s3://bucket/prefix otherwise",
            storage_root,
            len(alive),
        )


def is_single_node() -> bool:
    """True on a one-node Ray (the local instance); a cluster's nodes can come and go."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive")) <= 1
