"""torch's rendezvous store listens on a loopback master address only; other addresses and other
ranks get torch's own store (training/platform/_internal/loopback_store.py)."""

from __future__ import annotations

import datetime

import psutil
import pytest

from training.platform._internal import loopback_store

TIMEOUT = datetime.timedelta(seconds=10)


def _listening_on(port: int) -> set[str]:
    return {
        conn.laddr.ip
        for conn in psutil.Process().net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
    }


def _unused_create(*args):
    raise AssertionError(f"torch's own store was made for {args}")


def test_rank_zero_on_a_loopback_address_binds_only_that_address():
    from torch.distributed import TCPStore

    from training.platform.cluster import free_port

    port = free_port()
    store = loopback_store.create_store(_unused_create, "127.0.0.1", port, 0, 1, TIMEOUT)
    assert _listening_on(port) == {"127.0.0.1"}
    store.set("key", "value")
    client = TCPStore("127.0.0.1", port, 1, False, TIMEOUT)
    assert client.get("key") == b"value"


@pytest.mark.parametrize(
    ("host", "rank"), [("10.1.2.3", 0), ("node-a", 0), ("127.0.0.1", 1)], ids=str
)
def test_other_addresses_and_ranks_get_torchs_own_store(host, rank):
    made = []
    loopback_store.create_store(lambda *args: made.append(args), host, 29500, rank, 2, TIMEOUT)
    assert made == [(host, 29500, rank, 2, TIMEOUT, True)]


def test_install_wraps_torchs_factory_once(monkeypatch):
    import importlib

    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    monkeypatch.setattr(rendezvous, "_create_c10d_store", rendezvous._create_c10d_store)
    loopback_store.install()
    wrapped = rendezvous._create_c10d_store
    loopback_store.install()
    assert rendezvous._create_c10d_store is wrapped and wrapped._binds_loopback


def test_our_torch_config_installs_the_wrap_on_every_worker_before_the_process_group():
    from ray.train.torch import TorchConfig

    from training.platform import cluster

    config = cluster.torch_config("gloo", 60)
    assert isinstance(config, TorchConfig) and (config.backend, config.timeout_s) == ("gloo", 60)
    calls = []

    class Group:
        def execute(self, fn, **kwargs):
            calls.append(fn)

    backend = config.backend_cls()
    parent = type(backend).__mro__[1]
    original, parent.on_start = parent.on_start, lambda self, group, cfg: calls.append("setup")
    try:
        backend.on_start(Group(), config)
    finally:
        parent.on_start = original
    assert calls == [loopback_store.install, "setup"]
