"""The local stack: `trainflow up` / `down` / `status`.

``up`` starts, on 127.0.0.1 only, a Prefect server, an MLflow server (the same sqlite store and
artifact root the embedded default uses), a process work pool and a worker; it records every PID,
port and log file in ``<home>/stack/state.json``. ``down`` stops exactly those process groups.
The CLI reads the URLs from that state file while the stack runs (see trainflow/env.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.errors import ServiceUnreachableError, TrainflowError
from training.storage import trainflow_home

HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
DEFAULT_POOL = "trainflow"
DEFAULT_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0
HTTP_PROBE_TIMEOUT_S = 3.0
# The worker polls the server for due runs; Prefect's default (10 s) only delays a triggered run.
WORKER_QUERY_SECONDS = "5"
PARTS = ("prefect", "mlflow", "worker")


class StackError(TrainflowError):
    """The local stack cannot be started, found or stopped as asked."""


class PortInUseError(StackError):
    """A port the stack needs is taken by another program."""


@dataclass
class Part:
    """One process `up` started (a process-group leader)."""

    name: str
    pid: int
    create_time: float
    command: list[str]
    log: str
    url: str | None = None
    port: int | None = None

    def is_running(self) -> bool:
        return _same_process(self.pid, self.create_time)


@dataclass
class StackState:
    """What `up` started; the single source of truth for `down` and `status`."""

    home: str
    pool: str
    prefect_url: str
    mlflow_url: str
    artifacts_destination: str
    parts: dict[str, Part] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)

    @property
    def prefect_api_url(self) -> str:
        return f"{self.prefect_url}/api"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> StackState:
        raw = json.loads(text)
        parts = {name: Part(**part) for name, part in raw.pop("parts").items()}
        return cls(**raw, parts=parts)


# ------------------------------------------------------------------------------------ locations


def stack_dir(home: Path | None = None) -> Path:
    return (home or trainflow_home()) / "stack"


def state_path(home: Path | None = None) -> Path:
    return stack_dir(home) / "state.json"


def read_state(home: Path | None = None) -> StackState | None:
    path = state_path(home)
    if not path.is_file():
        return None
    try:
        return StackState.from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise StackError(
            f"the stack state file {path} is unreadable ({exc}); stop the processes it names by "
            "hand if any still run, then delete it"
        ) from None


def _write_state(state: StackState) -> None:
    path = state_path(Path(state.home))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, path)


def running_state(home: Path | None = None) -> StackState | None:
    """The recorded stack if every part of it still runs, else None (stale or absent)."""
    try:
        state = read_state(home)
    except StackError:
        return None
    if state is None or not state.parts:
        return None
    return state if all(part.is_running() for part in state.parts.values()) else None


# ------------------------------------------------------------------------------ process helpers


def _process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _same_process(pid: int, create_time: float) -> bool:
    """True if ``pid`` is alive and is the process we started (not a reused PID)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - create_time) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _pid_reused(part: Part) -> bool:
    """The recorded PID now names a younger, unrelated process (a zombie leader is still ours:
    its group's children may live on)."""
    started = _process_start_time(part.pid)
    return started is not None and abs(started - part.create_time) >= 1.0


def group_members(part: Part) -> list[int]:
    """PIDs of live processes in the part's process group.

    The kernel does not hand out a PID that is still some group's id, so while any member of
    our group lives the id is ours; if the PID instead belongs to a younger, unrelated process
    (our group died out and the number was reused), nothing is ours."""
    import psutil

    if _pid_reused(part):
        return []
    members = []
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if os.getpgid(proc.pid) != part.pid:
                continue
            if proc.info["create_time"] + 1.0 < part.create_time:
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


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


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers do: a port left in TIME_WAIT by a stopped server is free, a listener
        # is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def http_ok(url: str, timeout: float = HTTP_PROBE_TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _start(name: str, command: list[str], env: dict[str, str], log: Path, cwd: Path) -> Part:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # A new session makes the process a group leader: `down` stops it with its children.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    started = _process_start_time(proc.pid) or time.time()
    return Part(name=name, pid=proc.pid, create_time=started, command=command, log=str(log))


def _log_tail(part: Part, lines: int = 15) -> str:
    try:
        text = Path(part.log).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _wait_until(
    part: Part, ready: Callable[[], bool], deadline: float, what: str, interval: float = 0.5
) -> None:
    while time.monotonic() < deadline:
        if ready():
            return
        if not part.is_running():
            raise StackError(f"{what} exited during start-up; see {part.log}:\n{_log_tail(part)}")
        time.sleep(interval)
    raise StackError(
        f"{what} was not ready in time; see {part.log} (raise `trainflow up --timeout`):\n"
        f"{_log_tail(part)}"
    )


# ------------------------------------------------------------------------------------------ up


@dataclass
class UpOptions:
    prefect_port: int = DEFAULT_PREFECT_PORT
    mlflow_port: int = DEFAULT_MLFLOW_PORT
    pool: str = DEFAULT_POOL
    artifacts_destination: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


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
        if not port_is_free(port):
            raise PortInUseError(
                f"port {port} on {HOST} (for the {part}) is already in use by another program; "
                f"choose a free one with `trainflow up {option} PORT`"
            )


def service_environment(home: Path) -> dict[str, str]:
    """Quiet, offline defaults for every process of ours (CLI, servers, worker, flow runs)."""
    return {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray Data progress bars garble the stage logs; the stages log their own progress.
        "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
        "RAY_AIR_NEW_OUTPUT": "0",
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
        "GIT_PYTHON_REFRESH": "quiet",
    }


def base_environment(home: Path) -> dict[str, str]:
    """Environment of every stack process: the caller's (credentials included, never copied
    anywhere else), plus the home and quiet, offline services."""
    env = dict(os.environ)
    for key, value in service_environment(home).items():
        env.setdefault(key, value)
    env["TRAINFLOW_HOME"] = str(home)
    return env


def prefect_command(port: int) -> list[str]:
    return [_tool("prefect"), "server", "start", "--host", HOST, "--port", str(port)]


def mlflow_command(home: Path, port: int, artifacts_destination: str) -> list[str]:
    return [
        _tool("mlflow"),
        "server",
        "--host",
        HOST,
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
    start = time.monotonic()
    home = home or trainflow_home()
    existing = read_state(home)
    if existing is not None:
        alive = {name: part.is_running() for name, part in existing.parts.items()}
        if alive and all(alive.values()):
            return UpResult(existing, already_running=True, seconds=0.0)
        if any(alive.values()):
            dead = ", ".join(name for name, ok in alive.items() if not ok)
            raise StackError(
                f"the stack is partly running ({dead} stopped); run `trainflow down`, then "
                "`trainflow up`"
            )
        state_path(home).unlink()  # stale: nothing it names runs any more
    _check_ports(options)

    home.mkdir(parents=True, exist_ok=True)
    logs = stack_dir(home) / "logs"
    artifacts = options.artifacts_destination or str(home / "mlartifacts")
    state = StackState(
        home=str(home),
        pool=options.pool,
        prefect_url=f"http://{HOST}:{options.prefect_port}",
        mlflow_url=f"http://{HOST}:{options.mlflow_port}",
        artifacts_destination=artifacts,
    )
    env = base_environment(home)
    server_env = {**env, "PREFECT_UI_ENABLED": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server_env.pop("PREFECT_API_URL", None)
    cwd = stack_dir(home)
    deadline = time.monotonic() + options.timeout_s
    try:
        # Both servers start at once: each takes ~10 s to import and open its port.
        prefect = _start(
            "prefect",
            prefect_command(options.prefect_port),
            server_env,
            logs / "prefect-server.log",
            cwd,
        )
        prefect.url, prefect.port = state.prefect_url, options.prefect_port
        state.parts["prefect"] = prefect
        _write_state(state)
        mlflow = _start(
            "mlflow",
            mlflow_command(home, options.mlflow_port, artifacts),
            env,
            logs / "mlflow-server.log",
            cwd,
        )
        mlflow.url, mlflow.port = state.mlflow_url, options.mlflow_port
        state.parts["mlflow"] = mlflow
        _write_state(state)
        _wait_until(
            prefect,
            lambda: http_ok(f"{state.prefect_api_url}/health"),
            deadline,
            "the Prefect server",
        )
        _wait_until(
            mlflow, lambda: http_ok(f"{state.mlflow_url}/health"), deadline, "the MLflow server"
        )
        ensure_work_pool(state.prefect_api_url, options.pool)
        worker_env = {
            **env,
            "PREFECT_API_URL": state.prefect_api_url,
            "MLFLOW_TRACKING_URI": state.mlflow_url,
            "PREFECT_WORKER_QUERY_SECONDS": WORKER_QUERY_SECONDS,
        }
        worker = _start(
            "worker", worker_command(options.pool), worker_env, logs / "worker.log", cwd
        )
        state.parts["worker"] = worker
        _write_state(state)
        _wait_until(
            worker,
            lambda: bool(pool_workers(state.prefect_api_url, options.pool)),
            deadline,
            f"the worker of pool {options.pool!r}",
        )
    except BaseException:
        stop(state)
        raise
    return UpResult(state, already_running=False, seconds=round(time.monotonic() - start, 1))


# ------------------------------------------------------------------------------- Prefect's API


def _prefect_client(api_url: str):
    """A sync Prefect client bound to ``api_url`` (whatever the profile says)."""
    from contextlib import contextmanager

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    @contextmanager
    def client():
        with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as c:
            yield c

    return client()


def ensure_work_pool(api_url: str, pool: str) -> bool:
    """Create the process work pool (with Prefect's default job template) if missing."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with _prefect_client(api_url) as client:
        try:
            client.read_work_pool(pool)
            return False
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=pool,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                )
            )
            return True


def _post_json(url: str, body: dict[str, Any], timeout: float = HTTP_PROBE_TIMEOUT_S) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def pool_workers(api_url: str, pool: str) -> list[dict[str, Any]]:
    """Workers the server has heard from in the pool (empty if the server does not answer)."""
    try:
        return _post_json(f"{api_url}/work_pools/{pool}/workers/filter", {}) or []
    except (urllib.error.URLError, OSError, ValueError):
        return []


# ---------------------------------------------------------------------------------------- down


def stop(state: StackState, grace_s: float = STOP_GRACE_S) -> list[str]:
    """SIGTERM each recorded process group (worker first), SIGKILL what is left after the
    grace period; returns the parts that were running. Touches no other process."""
    stopped = []
    for name in reversed(list(state.parts)):
        part = state.parts[name]
        members = group_members(part)
        if not members and not part.is_running():
            continue
        stopped.append(name)
        _signal_group(part, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_members(part):
            time.sleep(0.2)
        if group_members(part):
            _signal_group(part, signal.SIGKILL)
            kill_deadline = time.monotonic() + 5.0
            while time.monotonic() < kill_deadline and group_members(part):
                time.sleep(0.1)
    return stopped


def _signal_group(part: Part, sig: int) -> None:
    if part.is_running():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(part.pid, sig)
        return
    # The leader is gone but children of ours may live on: signal them one by one.
    for pid in group_members(part):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def down(home: Path | None = None) -> tuple[StackState | None, list[str]]:
    """Stop what `up` recorded and remove the state file; (state, parts that were running)."""
    state = read_state(home)
    if state is None:
        return None, []
    stopped = stop(state)
    state_path(home).unlink(missing_ok=True)
    return state, stopped


# -------------------------------------------------------------------------------------- status


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
        "prefect": lambda: http_ok(f"{state.prefect_api_url}/health"),
        "mlflow": lambda: http_ok(f"{state.mlflow_url}/health"),
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


def deployments_overview(api_url: str, next_runs: int = 3) -> list[dict[str, Any]]:
    """Each deployment: name, schedules (cron/interval, timezone, active), paused, next runs."""
    try:
        deployments = _post_json(f"{api_url}/deployments/filter", {"limit": 200})
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServiceUnreachableError(
            f"Prefect API {api_url} is not reachable ({exc}); start it with `trainflow up`"
        ) from None
    overview = []
    for deployment in sorted(deployments, key=lambda d: d["name"]):
        runs = _post_json(
            f"{api_url}/flow_runs/filter",
            {
                "deployments": {"id": {"any_": [deployment["id"]]}},
                "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
                "sort": "EXPECTED_START_TIME_ASC",
                "limit": next_runs,
            },
        )
        overview.append(
            {
                "name": deployment["name"],
                "id": deployment["id"],
                "paused": deployment.get("paused", False),
                "schedules": [_describe_schedule(s) for s in deployment.get("schedules") or []],
                "next_runs": [run["expected_start_time"] for run in runs],
            }
        )
    return overview


def _describe_schedule(entry: dict[str, Any]) -> dict[str, Any]:
    schedule = entry.get("schedule") or {}
    if "cron" in schedule:
        text = f"cron {schedule['cron']}"
    elif "interval" in schedule:
        text = f"every {schedule['interval']} s"
    else:
        text = str(schedule)
    return {
        "schedule": text,
        "timezone": schedule.get("timezone"),
        "active": entry.get("active", True),
    }
