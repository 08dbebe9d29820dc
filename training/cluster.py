"""The one ``ray.init``: a local instance (embedded default) or an existing cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from pathlib import Path

from training import signals
from training.config import RayConfig
from training.errors import ConfigError, ServiceUnreachableError
from training.storage import trainflow_home

log = logging.getLogger(__name__)

# No network here and nothing to report to: keep Ray from phoning home.
_RAY_ENV_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # Dedup is useful, but Ray's "repeated Nx across cluster" lines confuse our summary output.
    "RAY_DEDUP_LOGS": "1",
    # Train V2 is the default in 2.60; say so explicitly so a user's env cannot flip it.
    "RAY_TRAIN_V2_ENABLED": "1",
    # Tune snapshots its state after every trial event; on small sweeps that is by design.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # Tune's own Ctrl-C handler makes Tuner.fit() return the unfinished trials as if the sweep
    # had ended, and the flow would train on them; a KeyboardInterrupt must stop the run.
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
    # Train V2's controller collects worker reports by polling every 2 s, and a worker's report
    # blocks until it is collected (a queue of one): on small data every epoch took >= 2 s
    # however fast it trained. 0.1 s costs the controller a few cheap RPCs a second. (Its
    # Ctrl-C handler can then let fit() return after an abort: signals.stop_if_received.)
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
}


# Only for a local instance: one machine that no autoscaler drains.
_LOCAL_INSTANCE_ENV_DEFAULTS = {
    # Train V2's preemption watcher is one more actor process per fit, started while the
    # workers start; it reacts to a node being drained. Off: train stage 14.8 s vs 16.0 s
    # (medians of 3 A/B on 2 cores).
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # A Ray worker that read a large parquet block kept ~600 MB of freed heap afterwards (its
    # allocators' retention), idle, until the run ended: at 10M rows two such workers beside
    # the training workers were the run's peak. Arrow's buffers from the system allocator, and
    # glibc returning every block over 16 MiB to the OS when freed (a fixed threshold; glibc's
    # own rises with each large block freed). Preprocessing 3M rows, Ray's processes then
    # held 2.9 GiB instead of 3.4 in the same 37 s; at 128 KiB they held 2.2 GiB but took 48 s.
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    "MALLOC_MMAP_THRESHOLD_": str(16 * 1024**2),
}


# True in the process that started the local instance it is connected to (the driver, which
# also stops it): nothing of that instance outlives this process.
_started_local_instance = False


def started_local_instance() -> bool:
    """True in the driver that started, and will stop, the local Ray instance it uses."""
    import ray

    return _started_local_instance and ray.is_initialized()


# A local instance started in a thread while the CLI imports the pipeline (``start_early``).
# Ray ties the instance's own processes (GCS, raylet, dashboard) to the *thread* that started
# them (PR_SET_PDEATHSIG: they are killed when it ends; seen as "Failed to connect to GCS" a
# minute later), so that thread waits until the instance is stopped.
_early: threading.Thread | None = None
_early_pending = False  # started early, not yet taken over by a connect() of the caller's
_early_done = threading.Event()  # the early start is over, well or not
_early_release = threading.Event()  # Ray is stopped: the starting thread may end
_early_error: list[BaseException] = []


def start_early(ray_config: RayConfig, py_modules: list[str] | None = None) -> None:
    """Start a local instance in a thread, so that its start (~6 s on 2 cores) runs beside
    the caller's imports and Prefect's start; the first ``connect`` waits for it and raises
    its error, if any. Nothing happens for a cluster address: a cluster is joined as needed."""
    global _early, _early_pending
    import ray

    # Imported here, before the thread starts: connect() imports Tune (and with it Train and
    # Data, which import one another), and two threads entering circular imports at once can
    # each find the other's modules half-initialised. The pipeline imports them anyway.
    from ray.tune.execution import class_cache  # noqa: F401

    if _early is not None or ray.is_initialized():
        return
    if ray_config.address or os.environ.get("RAY_ADDRESS"):
        return
    _early_done.clear()
    _early_release.clear()
    _early_error.clear()

    def start_and_hold() -> None:
        try:
            connect(ray_config, py_modules)
        except BaseException as exc:  # noqa: BLE001 - raised again by the caller's connect()
            _early_error.append(exc)
        finally:
            _early_done.set()
        _early_release.wait()

    _early_pending = True
    _early = threading.Thread(target=start_and_hold, name="ray-early-start", daemon=True)
    _early.start()


def _adopt_early_start(*, raise_error: bool = True) -> None:
    """Wait for an early start to end; then this thread (the main one, where signal handlers
    belong) watches for signals as ``connect`` does, or raises the start's error."""
    global _early_pending
    if not _early_pending or threading.current_thread() is _early:
        return
    _early_done.wait()
    _early_pending = False
    if _early_error:
        error = _early_error.pop()
        _end_early_thread()
        if raise_error:
            raise error
        return
    signals.watch()


def _end_early_thread() -> None:
    """Let the thread that started the instance end (the instance is stopped, or never was)."""
    global _early
    thread, _early = _early, None
    if thread is not None and thread is not threading.current_thread():
        _early_release.set()
        thread.join()


def ray_env() -> dict[str, str]:
    """Environment every Ray process of ours should see (driver and workers)."""
    return dict(_RAY_ENV_DEFAULTS)


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
    for key, value in _RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if _stopping is not None:  # a stop begun by `shutdown_soon` ends before anything new
        shutdown()
    if ray.is_initialized():
        return ray.cluster_resources()
    _keep_credentials_out_of_runtime_envs()
    address = ray_config.address or os.environ.get("RAY_ADDRESS")
    runtime_env = job_runtime_env(ray_config, address, py_modules)
    try:
        if address:
            _keep_local_instance_on_loopback(False)
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        else:
            _keep_local_instance_on_loopback(True)
            dashboard_port = free_port()
            # Train V2's placement-group cleaner queries the State API from inside the cluster;
            # without an explicit address it auto-detects, and with two Ray instances on one
            # machine (two runs at once, a test beside a run) it may ask the wrong one.
            runtime_env["env_vars"]["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard_port}"
            for key, value in _LOCAL_INSTANCE_ENV_DEFAULTS.items():
                runtime_env["env_vars"][key] = os.environ.get(key, value)
            with _environ_for_local_instance(runtime_env):
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
            _started_local_instance = True
        signals.watch()
    except ConnectionError as exc:
        raise ServiceUnreachableError(
            f"cannot connect to the Ray cluster at {address}: {exc}; check ray.address / "
            "RAY_ADDRESS, or unset it to use a local instance"
        ) from None
    return ray.cluster_resources()


@contextlib.contextmanager
def _environ_for_local_instance(runtime_env: dict):
    """Hand the job's env_vars to a local instance through this process's environment.

    The instance's processes inherit the driver's environment at ``ray.init`` (the raylet starts
    the workers), so the variables reach them either way; but a runtime_env, even of env_vars
    alone, gives the job a worker pool of its own, and the workers Ray prestarts at init (with
    no runtime_env) then serve nothing: every task and actor waited for a new process.
    ``py_modules`` stay. The environment is put back afterwards: a State API address left in it
    overrides the ``address`` of every later State API call in this process (Ray reads
    RAY_API_SERVER_ADDRESS first), which sent a test's cluster queries to an old instance.
    """
    env_vars = runtime_env.pop("env_vars", {})
    previous = {key: os.environ.get(key) for key in env_vars}
    os.environ.update(env_vars)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# Ray's switch for a machine that is its own whole cluster (Ray's default on macOS and Windows):
# the node's IP is 127.0.0.1, so every gRPC server, agent and metrics exporter binds loopback.
# Off (Ray's Linux default) the node takes the host's IP and those ports listen on all interfaces.
LOOPBACK_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _keep_local_instance_on_loopback(local: bool) -> None:
    """Every port of a local instance on 127.0.0.1 (docs/reliability.md, "Ports").

    The processes Ray starts read the switch from the environment they inherit; this process
    imported Ray already, so its copy of the constant is set too (Ray reads it at each call).
    A driver joining a cluster (``local`` False) gets Ray's default back: other nodes must
    reach it, and `ray start` refuses to join a cluster with the switch on.
    """
    from ray._private import ray_constants

    if local:
        os.environ.update(LOOPBACK_ONLY_ENV)
    else:
        for key, value in LOOPBACK_ONLY_ENV.items():
            if os.environ.get(key) == value:
                del os.environ[key]
    ray_constants.ENABLE_RAY_CLUSTER = not local and ray_constants.env_bool(
        ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
    )


# Names of credentials that must never travel in a runtime_env: Ray's runtime-env agent logs
# every runtime_env it creates, and the GCS keeps them. Workers of a local instance inherit
# them from the driver's environment; nodes of a cluster have their own (or an instance role).
CREDENTIAL_ENV_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)


def _keep_credentials_out_of_runtime_envs() -> None:
    """Stop Ray Tune copying the driver's AWS credentials into every trial's runtime_env.

    Tune's actor-class cache (``ray.tune.execution.class_cache``) adds each of these, when set
    in the driver's environment, to the ``env_vars`` of the trial actors' runtime_env — which
    the runtime-env agent then writes to its log in plain text. Tune has no option for it, so
    the names are taken out of its module-level set; nothing else in that set is touched.
    """
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE.difference_update(CREDENTIAL_ENV_VARS)


# The longest Unix socket path (108 bytes with the NUL) minus what Ray puts below its temp
# dir: "/session_<date>_<time>_<pid>/sockets/<name>" (pid up to 7 digits). The longest name is
# a dashboard module's, "dash_<Module>": dash_TaskEventsHead in Ray 2.60 (19 bytes; a home
# sized for plasma_store's 12 failed Ray's start with "Module MetricsHead failed to start").
# 24 leaves room for a longer module name in a later Ray.
_LONGEST_RAY_SOCKET_NAME = 24
_MAX_RAY_TEMP_DIR = (
    107 - len("/session_2026-11-23_11-49-38_123456_1234567/sockets/") - _LONGEST_RAY_SOCKET_NAME
)


def ray_temp_dir(home: Path | None = None) -> Path:
    """Where the local Ray instance keeps its sessions: ``<home>/ray``.

    A home too deep for Unix socket paths gets a short directory of its own in the system
    temp dir, and ``<home>/ray`` links to it; later runs follow the link. (A directory named
    after the home's path was shared by every home ever made at that path: a new home at a
    path pytest had used before found the old homes' Ray sessions in its own.)
    """
    home = home or trainflow_home()
    wanted = home / "ray"
    if len(str(wanted)) <= _MAX_RAY_TEMP_DIR:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    if wanted.is_symlink():
        short = wanted.resolve()
        short.mkdir(parents=True, exist_ok=True)  # the system may have cleaned its temp dir
        return short
    home.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix="trainflow-ray-", dir="/tmp"))
    if not wanted.exists():
        wanted.symlink_to(short, target_is_directory=True)
    return short


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
    _end_early_thread()


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
