"""Issue 17: every port of the local Ray instance (GCS, raylet, agents, metrics exporters, core
workers, the dashboard and its State API) listens on 127.0.0.1 only. The servers of `trainflow up`
are checked in tests/e2e/test_local_stack.py, a whole run in tests/e2e/test_pipeline.py."""

from __future__ import annotations

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
    me = psutil.Process()
    listeners = []
    for process in [me, *me.children(recursive=True)]:
        try:
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listeners.append((process.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    names = {name for name, _, _ in listeners}
    assert {"gcs_server", "raylet", "ray::DashboardAgent"} <= names, names
    assert [entry for entry in listeners if entry[1] not in LOOPBACK] == []
