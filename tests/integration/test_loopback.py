"""Every port of the local Ray instance (GCS, raylet, agents, metrics exporters, core
workers, the dashboard and its State API), and torch's rendezvous store while a TorchTrainer
runs, listens on 127.0.0.1 only. The servers of `trainflow up`
are checked in tests/e2e/test_local_stack.py, a whole run in tests/e2e/test_pipeline.py."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def test_local_ray_dashboard_listens_on_loopback_only(ray_local):
    import ray._private.worker as ray_worker

    webui = ray_worker._global_node.webui_url  # host:port the dashboard serves on
    host, _, _ = webui.rpartition(":")
    assert host == "127.0.0.1", webui


def test_every_port_of_the_local_instance_is_loopback(ray_local):
    import psutil
    import ray

    @ray.remote
    def touch() -> int:
        return 1

    assert ray.get([touch.remote() for _ in range(4)]) == [1] * 4  # workers are up
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    # This instance's processes only (the ones Ray started for ray_local's node and their
    # children, and this driver): a `ray start` cluster of the multi-node tests may run beside
    # it under the same pytest process, and binds as its own flags say.
    node = ray._private.worker._global_node
    roots = [
        psutil.Process(info.process.pid) for infos in node.all_processes.values() for info in infos
    ]
    tree = [psutil.Process(), *roots, *(c for root in roots for c in root.children(recursive=True))]
    listeners = []
    for process in tree:
        try:
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listeners.append((process.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    names = {name for name, _, _ in listeners}
    assert {"gcs_server", "raylet", "ray::DashboardAgent"} <= names, names
    assert [entry for entry in listeners if entry[1] not in LOOPBACK] == []


def test_torchs_rendezvous_store_listens_on_loopback(ray_local, tmp_path):
    """The last wildcard listener of a run was rank 0's TCPStore; our TorchConfig binds it to
    the loopback master address of a local instance."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from training.platform import cluster

    seen = tmp_path / "store.json"

    # Defined here, not at module level: Ray pickles it by value (the workers cannot import
    # this test module).
    def _store_listeners() -> None:
        """A Train worker's loop: rank 0 writes down where the rendezvous store listens."""
        import json
        import os

        import psutil
        import ray.train
        import torch.distributed as dist

        dist.barrier()  # every rank has joined the store
        port = int(os.environ["MASTER_PORT"])
        listening = sorted(
            conn.laddr.ip
            for conn in psutil.Process().net_connections(kind="inet")
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
        )
        if ray.train.get_context().get_world_rank() == 0:
            seen.write_text(json.dumps({"store": listening, "master": os.environ["MASTER_ADDR"]}))

    TorchTrainer(
        _store_listeners,
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        torch_config=cluster.torch_config("gloo", 60),
        run_config=ray.train.RunConfig(name="loopback-store", storage_path=str(tmp_path)),
    ).fit()
    found = json.loads(seen.read_text())
    assert found["master"] == "127.0.0.1"
    assert found["store"] == ["127.0.0.1"], found
