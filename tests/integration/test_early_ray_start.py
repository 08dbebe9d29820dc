"""`trainflow run` starts its local Ray instance in a thread, beside its imports.

Each case runs in a subprocess of its own: it needs a Ray instance of its own, and the tests in
this process share one (``ray_local``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration


def _run(script: str, tmp_path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={"TRAINFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_an_early_instance_outlives_its_start_and_is_stopped_by_shutdown(tmp_path):
    out = _run(
        """
        import threading, time
        import psutil, ray
        from training.platform import cluster
        from training.config import RayConfig

        cluster.start_early(RayConfig(num_cpus=2))
        assert not ray.is_initialized() or cluster._early.done.is_set()
        # Ray kills the instance's processes when the thread that started them ends: they
        # must live on after the start, until shutdown.
        cluster._early.done.wait()
        time.sleep(2)
        resources = cluster.connect(RayConfig(num_cpus=2))
        assert resources["CPU"] == 2, resources
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
        children = psutil.Process().children(recursive=True)
        assert any("gcs_server" in " ".join(c.cmdline()) for c in children)
        cluster.shutdown()
        assert not ray.is_initialized()
        assert not [t for t in threading.enumerate() if t.name == "ray-early-start"]
        _, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [" ".join(c.cmdline())[:120] for c in alive]
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip().endswith("ok")


def test_an_early_start_that_fails_raises_in_the_first_connect(tmp_path):
    out = _run(
        """
        import threading
        import ray
        from training.platform import cluster
        from training.config import RayConfig

        def refuse(**kwargs):
            raise ConnectionError("no room")

        ray.init = refuse
        cluster.start_early(RayConfig(num_cpus=2))
        try:
            cluster.connect(RayConfig(num_cpus=2))
        except cluster.ServiceUnreachableError as exc:
            print("raised:", exc)
        # the starting thread is gone, and a later connect starts afresh (here: fails again)
        assert not [t for t in threading.enumerate() if t.name == "ray-early-start"]
        assert cluster._early.idle
        cluster.shutdown()
        """,
        tmp_path,
    )
    assert "raised: cannot connect to the Ray cluster" in out and "no room" in out, out


def test_no_early_start_for_a_cluster_address(tmp_path):
    out = _run(
        """
        import threading
        from training.platform import cluster
        from training.config import RayConfig

        cluster.start_early(RayConfig(address="127.0.0.1:1"))
        assert cluster._early.idle
        assert not [t for t in threading.enumerate() if t.name == "ray-early-start"]
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip() == "ok"


def test_the_driver_keeps_arrows_own_pool_while_the_instance_gets_the_system_one(tmp_path):
    """While Ray starts, this process's environment holds the instance's variables, Arrow's
    system pool among them; Arrow picks its pool for good when it is imported, which training's
    modules do before the start, so the driver's reads keep Arrow's faster pool."""
    out = _run(
        """
        import os, time
        import ray
        from training.platform import cluster
        from training.config import RayConfig

        os.environ.pop("ARROW_DEFAULT_MEMORY_POOL", None)
        cluster.start_early(RayConfig(num_cpus=2))
        # The pipeline's first Arrow read comes while Ray starts, with the instance's
        # variables in this process's environment.
        while "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
            time.sleep(0.01)
        import pyarrow
        pyarrow.default_memory_pool()
        cluster.connect(RayConfig(num_cpus=2))

        @ray.remote
        def worker_pool():
            import pyarrow
            return pyarrow.default_memory_pool().backend_name

        print(pyarrow.default_memory_pool().backend_name, ray.get(worker_pool.remote()))
        cluster.shutdown()
        """,
        tmp_path,
    )
    driver, worker = out.split()
    assert worker == "system" and driver != "system", out
