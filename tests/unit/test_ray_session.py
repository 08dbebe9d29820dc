"""Where the local Ray instance keeps its session, and what never enters a runtime_env."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from training.platform import cluster
from training.platform._internal import env_defaults, patches, temp_dir


def test_ray_temp_dir_is_under_the_home():
    with tempfile.TemporaryDirectory(prefix="tf-", dir="/tmp") as short:
        home = Path(short) / "home"
        assert temp_dir.ray_temp_dir(home) == home / "ray"
        assert (home / "ray").is_dir()


def _longest_dashboard_socket_name() -> str:
    """``dash_<Module>`` for Ray's longest dashboard subprocess module, from Ray's own code."""
    import ray.dashboard.modules as modules

    names = [
        line.split("class ", 1)[1].split("(", 1)[0]
        for source in Path(modules.__path__[0]).rglob("*.py")
        for line in source.read_text().splitlines()
        if line.startswith("class ") and "SubprocessModule)" in line
    ]
    assert names, "no dashboard subprocess modules found: Ray's layout changed"
    return "dash_" + max(names, key=len)


@pytest.mark.parametrize("extra", [0, 1, 4, 20])
def test_every_ray_socket_path_fits_under_the_chosen_temp_dir(extra):
    """A home whose ``ray`` dir sits at the limit or past it: Ray's longest socket path under
    the chosen dir (a 7-digit pid, the longest dashboard module) still fits in 107 bytes."""
    longest = _longest_dashboard_socket_name()
    with tempfile.TemporaryDirectory(prefix="tf-", dir="/tmp") as short:
        fill = temp_dir.MAX_RAY_TEMP_DIR + extra - len(f"{short}//ray")
        home = Path(short) / ("h" * fill)
        temp = temp_dir.ray_temp_dir(home)
        assert (temp == home / "ray") == (extra == 0), temp
        path = f"{temp}/session_2026-11-25_15-37-43_606852_1234567/sockets/{longest}"
        assert len(path) <= 107, (len(path), path)
        if temp != home / "ray":
            temp.rmdir()


def test_a_home_too_deep_for_socket_paths_links_to_a_short_dir(tmp_path):
    home = tmp_path / ("deep-" * 12)
    temp = temp_dir.ray_temp_dir(home)
    assert len(str(temp)) <= temp_dir.MAX_RAY_TEMP_DIR, temp
    assert (home / "ray").is_symlink() and (home / "ray").resolve() == temp.resolve()
    # Asked again, the same place: the link is kept.
    assert temp_dir.ray_temp_dir(home) == temp
    # A new home at the same path gets a directory of its own, without the old one's sessions.
    (temp / "session_old").mkdir()
    (home / "ray").unlink()
    fresh = temp_dir.ray_temp_dir(home)
    assert fresh != temp and not list(fresh.iterdir())
    assert (home / "ray").resolve() == fresh.resolve()
    for made in (temp / "session_old", temp, fresh):
        made.rmdir()


def test_tune_no_longer_copies_credentials_into_trial_runtime_envs(monkeypatch):
    from ray.tune.execution import class_cache

    monkeypatch.setattr(
        class_cache, "ENV_VARS_TO_PROPAGATE", set(class_cache.ENV_VARS_TO_PROPAGATE)
    )
    for name in patches.CREDENTIAL_ENV_VARS:
        monkeypatch.setenv(name, f"canary-{name}")
    patches.keep_credentials_out_of_runtime_envs()
    # Every AWS credential name Tune knows is covered, not only the ones we listed.
    assert not {n for n in class_cache.ENV_VARS_TO_PROPAGATE if n.startswith("AWS_")}

    class Trainable:
        pass

    remote = class_cache._ActorClassCache().get(Trainable)
    env_vars = remote._default_options["runtime_env"]["env_vars"]
    assert not set(patches.CREDENTIAL_ENV_VARS) & set(env_vars), env_vars


def test_a_local_instance_is_switched_to_loopback_and_a_cluster_driver_back(monkeypatch):
    from ray._private import ray_constants, services

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.setattr("ray._private.worker._global_node", None)
    patches.keep_local_instance_on_loopback(True)
    # What the processes Ray starts inherit, and what this one resolves its node IP to.
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert services.get_node_ip_address() == "127.0.0.1"
    patches.keep_local_instance_on_loopback(False)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    assert ray_constants.ENABLE_RAY_CLUSTER is True


def test_a_local_instance_inherits_our_env_vars_instead_of_a_runtime_env(monkeypatch):
    """An env_vars runtime_env would give the job its own worker pool, leaving the workers Ray
    prestarts unused; a local instance's processes inherit the driver's environment instead,
    and only while Ray starts them."""
    # A copy of the environment: nothing set here outlives the test.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    os.environ["RAY_DEDUP_LOGS"] = "users-own"
    runtime_env = cluster.job_runtime_env(cluster.RayConfig(), None, ["/models"])
    runtime_env["env_vars"]["RAY_API_SERVER_ADDRESS"] = "http://127.0.0.1:1234"
    with env_defaults.environ_for_local_instance(runtime_env):
        assert runtime_env == {"py_modules": ["/models"]}  # a custom model's package travels
        assert os.environ["RAY_API_SERVER_ADDRESS"] == "http://127.0.0.1:1234"
        assert os.environ["RAY_DEDUP_LOGS"] == cluster.ray_env()["RAY_DEDUP_LOGS"]
    # Afterwards the State API address is gone (Ray would send every later State API call of
    # this process to it, whatever address the call names) and the user's own value is back.
    assert "RAY_API_SERVER_ADDRESS" not in os.environ
    assert os.environ["RAY_DEDUP_LOGS"] == "users-own"


def test_a_local_instance_runs_no_preemption_watcher_unless_asked(monkeypatch):
    """...and its processes give freed memory back (Arrow's system pool, glibc's fixed mmap
    threshold), in Ray's processes only."""
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for key in ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "ARROW_DEFAULT_MEMORY_POOL"):
        os.environ.pop(key, None)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # a user's own value
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    started = {}

    def fake_init(**kwargs):
        started.update(kwargs, env=dict(os.environ))
        raise ConnectionError("stop here")

    import ray
    from ray._private import ray_constants

    # connect() flips Ray's loopback switch for a local instance: put it back afterwards.
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    with pytest.raises(cluster.ServiceUnreachableError):
        cluster.connect(cluster.RayConfig())
    assert started["env"]["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    assert started["env"]["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert started["env"]["MALLOC_MMAP_THRESHOLD_"] == "65536"
    assert started["runtime_env"] == {}  # every variable inherited, none in a runtime_env
    assert started["env"]["RAY_API_SERVER_ADDRESS"].startswith("http://127.0.0.1:")
    # Only Ray's processes keep them: this one's later State API calls go where they say.
    assert "RAY_API_SERVER_ADDRESS" not in os.environ
    assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in os.environ
    assert "ARROW_DEFAULT_MEMORY_POOL" not in os.environ
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "65536"
    os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "1"  # the user's choice wins
    with pytest.raises(cluster.ServiceUnreachableError):
        cluster.connect(cluster.RayConfig())
    assert started["env"]["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"


def test_ray_stops_in_the_background_and_shutdown_waits_for_it(monkeypatch):
    import threading

    import ray

    started, release, calls = threading.Event(), threading.Event(), []

    def slow_shutdown():
        calls.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        initialized[0] = False

    initialized = [True]
    monkeypatch.setattr(ray, "is_initialized", lambda: initialized[0])
    monkeypatch.setattr(ray, "shutdown", slow_shutdown)
    cluster.shutdown_soon()
    assert started.wait(10)  # stopping in another thread while this one goes on
    assert calls == ["ray-shutdown"]
    cluster.shutdown_soon()  # a second call starts nothing more
    waiter = threading.Thread(target=cluster.shutdown)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # shutdown() waits for the stop to finish
    release.set()
    waiter.join(10)
    assert not waiter.is_alive()
    assert calls == ["ray-shutdown"]  # and does not stop twice
