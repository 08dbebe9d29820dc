"""The environment every Ray process of ours sees, and how a local instance receives it."""

from __future__ import annotations

import contextlib
import os

# No network here and nothing to report to: keep Ray from phoning home.
RAY_ENV_DEFAULTS = {
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
LOCAL_INSTANCE_ENV_DEFAULTS = {
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


def local_instance_env_vars() -> dict[str, str]:
    """The local-instance defaults, a user's own values winning."""
    return {key: os.environ.get(key, value) for key, value in LOCAL_INSTANCE_ENV_DEFAULTS.items()}


@contextlib.contextmanager
def environ_for_local_instance(runtime_env: dict):
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
