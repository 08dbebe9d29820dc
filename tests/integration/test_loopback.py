"""Issue 5 case 13: the local Ray instance's dashboard (its HTTP and State API) listens on
127.0.0.1 only. The servers of `trainflow up` are checked in tests/e2e/test_local_stack.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_local_ray_dashboard_listens_on_loopback_only(ray_local):
    import psutil
    import ray._private.worker as ray_worker

    webui = ray_worker._global_node.webui_url  # host:port the dashboard serves on
    host, _, port = webui.rpartition(":")
    assert host == "127.0.0.1", webui
    listeners = [
        conn
        for conn in psutil.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == int(port)
    ]
    assert listeners, f"nothing listens on the dashboard port {port}"
    assert {conn.laddr.ip for conn in listeners} == {"127.0.0.1"}, listeners
