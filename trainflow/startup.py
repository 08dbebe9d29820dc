"""trainflow's start-up speed-ups, and the one switch that turns them all off.

``TRAINFLOW_FAST_START=0`` (default on) runs every command the plain way, as the libraries start
and stop by themselves: to measure what the speed-ups save, or to rule them out when a start
misbehaves. It turns off:

1. **The early Ray start** (``start_ray_early``): ``trainflow run`` starts its local Ray instance
   in a thread while it imports the pipeline (~6 s on 2 cores), and the first stage finds it up.
   The thread's mechanics: training/platform/_internal/early_start.py. Off: the first stage
   starts Ray.
2. **Prefect's temporary server beside the imports** (``start_prefect_early``; the mechanics in
   trainflow/prefect_server.py). Off: Prefect's client starts it when the flow begins.
3. **Database templates**: a fresh home's MLflow and Prefect databases are copies of empty,
   already migrated ones (training/platform/db_templates.py; it reads the switch through
   ``training.platform.fast_start``, since the MLflow store is below the CLI). Off: each
   library migrates its database in place.
4. **The quick exit** (``exit_promptly``): the ``trainflow`` command skips the interpreter's
   teardown of its modules (5–8 s after a run). Off: the interpreter exits normally.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from training.platform import fast_start

if TYPE_CHECKING:
    from trainflow.prefect_server import EarlyTemporaryServer
    from training.config import RayConfig

SWITCH_ENV = fast_start.SWITCH_ENV


def enabled() -> bool:
    """The speed-ups are on (``TRAINFLOW_FAST_START`` is not ``0``)."""
    return fast_start.enabled()


def start_ray_early(ray_config: RayConfig, py_modules: list[str]) -> bool:
    """Start the local Ray instance in a thread now; True if a start was asked for."""
    if not enabled():
        return False
    from training.platform import cluster

    cluster.start_early(ray_config, py_modules)
    return True


def start_prefect_early() -> EarlyTemporaryServer | None:
    """Prefect's temporary server, starting in a thread (wait for it before the flow runs)."""
    if not enabled():
        return None
    from trainflow.prefect_server import EarlyTemporaryServer

    return EarlyTemporaryServer()


def exit_promptly(code: int, last_word: Callable[[int], int] | None = None) -> NoReturn:
    """End the process with ``code``, skipping the interpreter's teardown of its modules.

    After a run, that teardown (freeing torch, Ray's core worker, gRPC channels, thousands of
    modules) took 5–8 s with nothing left to do. Everything the interpreter runs on its way
    out still runs, in its order: threading's exit hooks and the join of non-daemon threads
    (Prefect drains its log and event queues there), then the atexit handlers (Prefect's
    temporary server stops, logging flushes). Only the teardown of the modules' memory is
    skipped. ``last_word`` turns the code into the one to exit with, once those ran (a Ctrl-C
    while they ran: trainflow/interrupts.py).
    """
    if not enabled():
        sys.exit(last_word(code) if last_word else code)
    import atexit
    import contextlib
    import os
    import threading

    # A Ctrl-C here interrupts the joins, not the exit: ``last_word`` reports it.
    with contextlib.suppress(KeyboardInterrupt):
        threading._shutdown()  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()  # prints a handler's exception, as the interpreter does, and goes on
    if last_word is not None:
        code = last_word(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
