"""The local stack: `trainflow up` / `down` / `status`.

``up`` starts, on 127.0.0.1 only, a Prefect server, an MLflow server (the same sqlite store and
artifact root the embedded default uses), a process work pool and a worker; it records every PID,
port and log file in ``<home>/stack/state.json`` (stack_state.py). ``down`` stops exactly those
process groups (processes.py). Prefect is asked through its own client (prefect_api.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deployments.exposure import StackAuth, client_host
from deployments.prefect_api import ensure_work_pool, pool_workers
from deployments.processes import Part, log_tail, port_is_free, start_process, stop_parts
from deployments.stack_state import (
    StackError,
    StackState,
    read_state,
    stack_dir,
    state_path,
    write_state,
)
from training.platform.probe import health_url, http_problem
from training.storage import trainflow_home

HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
DEFAULT_POOL = "trainflow"
DEFAULT_TIMEOUT_S = 180.0
HTTP_PROBE_TIMEOUT_S = 3.0
# The worker polls the server for due runs; Prefect's default (10 s) only delays a triggered run.
WORKER_QUERY_SECONDS = "5"
PARTS = ("prefect", "mlflow", "worker")


class PortInUseError(StackError):
    """A port the stack needs is taken by another program."""

    user_error = True


def answers_health(url: str) -> bool:
    """``url``'s /health answers 200 within the probe timeout."""
    return http_problem(health_url(url), HTTP_PROBE_TIMEOUT_S) is None


def _tool(name: str) -> str:
    """The console script installed beside this interpreter (the project's venv)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    import shutil

    found = shutil.which(name)
    if found is None:
        raise StackError(f"`{name}` is not installed; run `make setup`")
    return found


def _wait_until(
    part: Part, ready: Callable[[], bool], deadline: float, what: str, interval: float = 0.5
) -> None:
    while time.monotonic() < deadline:
        if ready():
            return
        if not part.is_running():
            raise StackError(f"{what} exited during start-up; see {part.log}:\n{log_tail(part)}")
        time.sleep(interval)
    raise StackError(
        f"{what} was not ready in time; see {part.log} (raise `trainflow up --timeout`):\n"
        f"{log_tail(part)}"
    )


@dataclass
class UpOptions:
    prefect_port: int = DEFAULT_PREFECT_PORT
    mlflow_port: int = DEFAULT_MLFLOW_PORT
    pool: str = DEFAULT_POOL
    artifacts_destination: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    host: str = HOST  # anything but loopback needs credentials (exposure.py)


@dataclass
class UpResult:
    state: StackState
    already_running: bool
    seconds: float


def _check_ports(options: UpOptions) -> None:
    if options.prefect_port == options.mlflow_port:
        raise PortInUseError(
            f"--prefect-port and --mlflow-port are both {options.prefect_port}; give them "
            "different ports"
        )
    for port, part, option in (
        (options.prefect_port, "Prefect server", "--prefect-port"),
        (options.mlflow_port, "MLflow server", "--mlflow-port"),
    ):
        if not port_is_free(port, options.host):
            raise PortInUseError(
                f"port {port} on {options.host} (for the {part}) is already in use by another "
                "program; "
                f"choose a free one with `trainflow up {option} PORT`"
            )


PREFECT_CLIENT_RETRIES = 7


def service_environment(home: Path) -> dict[str, str]:
    """Quiet, offline defaults for every process of ours (CLI, servers, worker, flow runs)."""
    return {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AIR_NEW_OUTPUT": "0",
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
        "GIT_PYTHON_REFRESH": "quiet",
        # trainflow's progress events reach the flow run's logs in the Prefect UI.
        "PREFECT_LOGGING_EXTRA_LOGGERS": "trainflow",
        # ... from the flow's threads; events outside a run (Tune's callback thread, after the
        # flow) stay in the log file without a warning each.
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        # The temporary server's 20 s default is too short on a busy 2-core machine.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        # A Prefect server that stops answering mid-run (restarted, moved) is waited for by
        # Prefect's client: 2, 4, 8, ... s between tries. Its 5 retries give up after ~62 s,
        # sooner than a server takes to stop and start again; 7 ride out ~4 min
        # (trainflow/prefect_outage.py says what a run does past that).
        "PREFECT_CLIENT_MAX_RETRIES": str(PREFECT_CLIENT_RETRIES),
    }


def base_environment(home: Path) -> dict[str, str]:
    """Environment of every stack process: the caller's (credentials included, never copied
    anywhere else), plus the home and quiet, offline services."""
    env = dict(os.environ)
    for key, value in service_environment(home).items():
        env.setdefault(key, value)
    env["TRAINFLOW_HOME"] = str(home)
    return env


def prefect_server_environment(env: dict[str, str], state: StackState) -> dict[str, str]:
    """The Prefect server's environment: its UI on, and the API URL its UI announces at
    ``/ui-settings`` set to where clients reach this server. Prefect derives that URL from its
    own host/port settings, not from ``server start --port``, so without it every UI page of a
    stack on another port talks to 127.0.0.1:4200."""
    server_env = {
        **env,
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_API_URL": state.prefect_api_url,
    }
    server_env.pop("PREFECT_API_URL", None)  # a client setting; the server's UI would use it
    server_env.pop("PREFECT_UI_API_URL", None)  # a caller's stale alias must not win
    return server_env


def mlflow_server_environment(env: dict[str, str]) -> dict[str, str]:
    """The MLflow server's environment: without MLflow's server-side job execution, which
    trainflow never uses (GenAI scorers, trace roll-ups) and which starts a job runner and
    seven consumer processes beside the server (~24 CPU-seconds of imports on 2 cores, ~1 GB
    resident)."""
    return {**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def prefect_command(port: int, host: str = HOST) -> list[str]:
    return [_tool("prefect"), "server", "start", "--host", host, "--port", str(port)]


def mlflow_command(
    home: Path, port: int, artifacts_destination: str, host: str = HOST, auth: bool = False
) -> list[str]:
    return [
        _tool("mlflow"),
        "server",
        *(["--app-name", "basic-auth"] if auth else []),
        "--host",
        host,
        "--port",
        str(port),
        "--backend-store-uri",
        f"sqlite:///{home / 'mlflow.db'}",
        "--artifacts-destination",
        artifacts_destination,
        "--workers",
        "1",
    ]


def worker_command(pool: str) -> list[str]:
    return [_tool("prefect"), "worker", "start", "--pool", pool, "--type", "process"]


def up(options: UpOptions, home: Path | None = None) -> UpResult:
    """Start the stack, or report the one already running. Stops what it started on failure."""
    began = time.monotonic()
    home = home or trainflow_home()
    existing = _running_stack(home)
    if existing is not None:
        return UpResult(existing, already_running=True, seconds=0.0)
    auth = StackAuth.required_for(options.host)  # refuses an unguarded exposed host
    _check_ports(options)

    home.mkdir(parents=True, exist_ok=True)
    state = StackState(
        home=str(home),
        pool=options.pool,
        prefect_url=f"http://{client_host(options.host)}:{options.prefect_port}",
        mlflow_url=f"http://{client_host(options.host)}:{options.mlflow_port}",
        artifacts_destination=options.artifacts_destination or str(home / "mlartifacts"),
        host=options.host,
    )
    try:
        _start_parts(state, options, auth, time.monotonic() + options.timeout_s)
    except BaseException:
        stop(state)
        raise
    return UpResult(state, already_running=False, seconds=round(time.monotonic() - began, 1))


def _running_stack(home: Path) -> StackState | None:
    """The stack already running in this home, if all of it runs; a stale state file (nothing it
    names runs) is removed; a partly running stack is an error naming what stopped."""
    existing = read_state(home)
    if existing is None:
        return None
    alive = {name: part.is_running() for name, part in existing.parts.items()}
    if alive and all(alive.values()):
        return existing
    if any(alive.values()):
        dead = ", ".join(name for name, ok in alive.items() if not ok)
        raise StackError(
            f"the stack is partly running ({dead} stopped); run `trainflow down`, then "
            "`trainflow up`"
        )
    state_path(home).unlink()
    return None


def _start_parts(
    state: StackState, options: UpOptions, auth: StackAuth | None, deadline: float
) -> None:
    """Both servers at once (each takes ~10 s to import and open its port), then the work pool
    and its worker; each part is in the state file as soon as it starts."""
    home = Path(state.home)
    logs, cwd = stack_dir(home) / "logs", stack_dir(home)
    cwd.mkdir(parents=True, exist_ok=True)
    env = base_environment(home)
    mlflow_env = mlflow_server_environment(env)
    if auth is not None:
        env.update(auth.client_env())  # the worker and its flow runs, like this CLI
        os.environ.update(auth.client_env())
        mlflow_env.update(auth.mlflow_server_env(cwd))
    server_env = prefect_server_environment(env, state)
    if auth is not None:
        server_env.update(auth.prefect_server_env())
    prefect_cmd = prefect_command(options.prefect_port, options.host)
    prefect = start_process("prefect", prefect_cmd, server_env, logs / "prefect-server.log", cwd)
    prefect = _record(state, prefect, state.prefect_url, options.prefect_port)
    mlflow_cmd = mlflow_command(
        home, options.mlflow_port, state.artifacts_destination, options.host, auth is not None
    )
    mlflow = start_process("mlflow", mlflow_cmd, mlflow_env, logs / "mlflow-server.log", cwd)
    mlflow = _record(state, mlflow, state.mlflow_url, options.mlflow_port)
    _wait_until(
        prefect, lambda: answers_health(state.prefect_api_url), deadline, "the Prefect server"
    )
    _wait_until(mlflow, lambda: answers_health(state.mlflow_url), deadline, "the MLflow server")
    ensure_work_pool(state.prefect_api_url, options.pool)
    worker_env = {
        **env,
        "PREFECT_API_URL": state.prefect_api_url,
        "MLFLOW_TRACKING_URI": state.mlflow_url,
        "PREFECT_WORKER_QUERY_SECONDS": WORKER_QUERY_SECONDS,
    }
    worker_cmd = worker_command(options.pool)
    worker = _record(
        state, start_process("worker", worker_cmd, worker_env, logs / "worker.log", cwd)
    )
    _wait_until(
        worker,
        lambda: bool(pool_workers(state.prefect_api_url, options.pool)),
        deadline,
        f"the worker of pool {options.pool!r}",
    )


def _record(state: StackState, part: Part, url: str | None = None, port: int | None = None) -> Part:
    """Write a part just started into the state file at once: `down` can stop it from now on."""
    part.url, part.port = url, port
    state.parts[part.name] = part
    write_state(state)
    return part


def stop(state: StackState) -> list[str]:
    """Stop every recorded part, the worker first; returns the parts that were running."""
    return stop_parts(list(reversed(state.parts.values())))


def down(home: Path | None = None) -> tuple[StackState | None, list[str]]:
    """Stop what `up` recorded and remove the state file; (state, parts that were running)."""
    state = read_state(home)
    if state is None:
        return None, []
    stopped = stop(state)
    state_path(home).unlink(missing_ok=True)
    return state, stopped


@dataclass
class PartStatus:
    name: str
    url: str | None
    pid: int
    running: bool
    healthy: bool
    log: str


def part_statuses(state: StackState) -> list[PartStatus]:
    checks = {
        "prefect": lambda: answers_health(state.prefect_api_url),
        "mlflow": lambda: answers_health(state.mlflow_url),
        "worker": lambda: bool(pool_workers(state.prefect_api_url, state.pool)),
    }
    statuses = []
    for name in PARTS:
        part = state.parts.get(name)
        if part is None:
            continue
        running = part.is_running()
        healthy = running and checks[name]()
        url = part.url if name != "worker" else f"pool {state.pool}"
        statuses.append(PartStatus(name, url, part.pid, running, healthy, part.log))
    return statuses
