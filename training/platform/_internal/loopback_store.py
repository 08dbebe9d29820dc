"""torch's rendezvous store on loopback when its master address is loopback.

Ray Train hands every worker ``MASTER_ADDR`` (rank 0's node IP: 127.0.0.1 on a local instance,
whose node IP is loopback) and ``MASTER_PORT``, and each calls ``init_process_group``; rank 0's
``TCPStore`` then listens on that port of *every* interface, whatever the address says (torch has
no bind-address option). ``TCPStore`` can instead serve a socket its caller bound
(``master_listen_fd``): on a loopback master address rank 0 binds it there. Any other address
(a multi-node cluster) gets torch's own store unchanged.

The store is made in ``torch.distributed.rendezvous._create_c10d_store`` (both the ``env://``
and the ``tcp://`` rendezvous call it), so that function is wrapped, in the training workers
only: ``LoopbackStoreTorchConfig`` runs the wrap on them before Ray sets up the process group,
through Ray's own extension point for a TorchConfig (``backend_cls``, as Ray's torchft config).
"""

from __future__ import annotations

import importlib
import ipaddress
import socket
from dataclasses import dataclass

from ray.train.torch.config import TorchConfig, _TorchBackend


def _rendezvous_module():
    # The module, not the function ``torch.distributed.rendezvous`` that shadows its name.
    return importlib.import_module("torch.distributed.rendezvous")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def create_store(create, hostname, port, rank, world_size, timeout, use_libuv=True):
    """torch's ``_create_c10d_store`` (``create``), but rank 0's server on a loopback
    ``hostname`` listens on that address only."""
    from torch.distributed import TCPStore

    if (
        rank != 0
        or not is_loopback(hostname)
        or _rendezvous_module()._torchelastic_use_agent_store()
    ):
        return create(hostname, port, rank, world_size, timeout, use_libuv)
    family = socket.AF_INET6 if ":" in hostname else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((hostname, port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return TCPStore(
        host_name=hostname,
        port=port,
        world_size=world_size,
        is_master=True,
        timeout=timeout,
        multi_tenant=True,
        # detach(): the store owns the socket now; Python must not close it under the server.
        master_listen_fd=sock.detach(),
        use_libuv=use_libuv,
    )


def install() -> None:
    """Wrap torch's store factory in this process (once)."""
    rendezvous = _rendezvous_module()
    original = rendezvous._create_c10d_store
    if getattr(original, "_binds_loopback", False):
        return

    def create_c10d_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        return create_store(original, hostname, port, rank, world_size, timeout, use_libuv)

    create_c10d_store._binds_loopback = True
    rendezvous._create_c10d_store = create_c10d_store


class _LoopbackStoreBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config) -> None:
        worker_group.execute(install)
        super().on_start(worker_group, backend_config)


@dataclass
class LoopbackStoreTorchConfig(TorchConfig):
    """Ray's TorchConfig, with rank 0's rendezvous store bound to a loopback master address."""

    @property
    def backend_cls(self):
        return _LoopbackStoreBackend
