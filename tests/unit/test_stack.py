"""Our glue around the local stack, without servers: port conflicts, `up` twice, `down` touching
only what was recorded, the CLI picking up the stack's URLs, and the messages for unreachable
services. The real servers: tests/e2e/test_local_stack.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployments import processes, stack, stack_state
from training.errors import ConfigError, ServiceUnreachableError

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def home(tmp_path):
    """A fresh home; the environment (which prepare_environment changes) restored afterwards."""
    saved = dict(os.environ)
    os.environ["TRAINFLOW_HOME"] = str(tmp_path)
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        os.environ.pop(key, None)
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def sleepers():
    """Start process groups that only sleep; kill whatever is left at the end (by PID)."""
    started: list[subprocess.Popen] = []

    def start(command: str = "sleep 120") -> subprocess.Popen:
        proc = subprocess.Popen(["sh", "-c", command], start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def record(home: Path, procs: dict[str, subprocess.Popen]) -> stack_state.StackState:
    state = stack_state.StackState(
        home=str(home),
        pool="trainflow",
        prefect_url="http://127.0.0.1:1",
        mlflow_url="http://127.0.0.1:2",
        artifacts_destination=str(home / "mlartifacts"),
    )
    for name, proc in procs.items():
        state.parts[name] = processes.Part(
            name=name,
            pid=proc.pid,
            create_time=processes.process_start_time(proc.pid),
            command=["sh"],
            log=str(home / f"{name}.log"),
        )
    stack_state.write_state(state)
    return state


def test_port_taken_by_another_program_names_port_and_option(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(stack.PortInUseError) as prefect_error:
            stack.up(stack.UpOptions(prefect_port=port, mlflow_port=free_port()), home)
        with pytest.raises(stack.PortInUseError) as mlflow_error:
            stack.up(stack.UpOptions(prefect_port=free_port(), mlflow_port=port), home)
    assert f"port {port}" in str(prefect_error.value)
    assert "--prefect-port" in str(prefect_error.value)
    assert f"port {port}" in str(mlflow_error.value)
    assert "--mlflow-port" in str(mlflow_error.value)
    assert not stack_state.state_path(home).exists()  # nothing started, nothing recorded


def test_same_port_for_both_servers_is_refused(home):
    port = free_port()
    with pytest.raises(stack.PortInUseError, match="different ports"):
        stack.up(stack.UpOptions(prefect_port=port, mlflow_port=port), home)


def test_cli_port_conflict_exits_non_zero_with_the_message(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "trainflow", "up", "--mlflow-port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "TRAINFLOW_HOME": str(home)},
            cwd=home,
        )
    assert proc.returncode == 2  # the user picks another port
    assert f"port {port}" in proc.stderr and "--mlflow-port" in proc.stderr


def test_up_twice_reports_the_running_stack_and_starts_nothing(home, sleepers):
    procs = {name: sleepers() for name in stack.PARTS}
    before = record(home, procs)
    # Ports that are taken would fail a real start: `up` must not even look at them.
    result = stack.up(stack.UpOptions(prefect_port=1, mlflow_port=1), home)
    assert result.already_running
    assert result.state == before
    assert stack_state.read_state(home) == before


def test_a_partly_running_stack_is_not_started_over(home, sleepers):
    alive, dead = sleepers(), sleepers("true")
    dead.wait(timeout=10)
    record(home, {"prefect": alive, "mlflow": dead})
    with pytest.raises(stack_state.StackError, match="trainflow down"):
        stack.up(stack.UpOptions(), home)


def test_down_stops_exactly_the_recorded_process_groups(home, sleepers):
    # The recorded part has a child in its group (as the MLflow server has its workers).
    recorded = sleepers("sleep 120 & sleep 120; wait")
    stranger = sleepers()
    record(home, {"mlflow": recorded})
    time.sleep(0.3)
    members = processes.group_members(stack_state.read_state(home).parts["mlflow"])
    assert len(members) >= 2

    state, stopped = stack.down(home)
    assert stopped == ["mlflow"]
    recorded.wait(timeout=10)
    assert processes.group_members(state.parts["mlflow"]) == []
    assert stranger.poll() is None  # another program's process lives on
    assert not stack_state.state_path(home).exists()


def test_down_leaves_a_reused_pid_alone(home, sleepers):
    stranger = sleepers()
    state = record(home, {"worker": stranger})
    state.parts["worker"].create_time -= 3600  # the PID now belongs to some other process
    stack_state.write_state(state)
    _, stopped = stack.down(home)
    assert stopped == []
    assert stranger.poll() is None


def test_down_without_a_stack_is_a_no_op(home):
    assert stack.down(home) == (None, [])


def test_cli_uses_the_running_stack_unless_told_otherwise(home, sleepers):
    from trainflow import env

    procs = {name: sleepers() for name in stack.PARTS}
    state = record(home, procs)
    env.prepare_environment()
    assert os.environ["PREFECT_API_URL"] == state.prefect_api_url
    assert os.environ["MLFLOW_TRACKING_URI"] == state.mlflow_url

    # Exported variables win over the state file; so does a configured tracking URI.
    os.environ["PREFECT_API_URL"] = "http://elsewhere:4200/api"
    del os.environ["MLFLOW_TRACKING_URI"]
    env.prepare_environment(tracking_uri_configured=True)
    assert os.environ["PREFECT_API_URL"] == "http://elsewhere:4200/api"
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_a_stale_state_file_is_ignored(home, sleepers):
    from trainflow import env

    gone = sleepers("true")
    gone.wait(timeout=10)
    record(home, {name: gone for name in stack.PARTS})
    assert stack_state.running_state(home) is None
    env.prepare_environment()
    assert "PREFECT_API_URL" not in os.environ


# --------------------------------------------------------- unreachable services


def test_prefect_api_down_names_the_url_and_the_fix(monkeypatch):
    from trainflow.env import check_prefect_api

    url = f"http://127.0.0.1:{free_port()}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    start = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as error:
        check_prefect_api()
    assert time.monotonic() - start < 10
    assert url in str(error.value) and "trainflow up" in str(error.value)
    assert error.value.retriable


def test_prefect_api_probes_of_a_server_that_is_down(home):
    """Through Prefect's client: `status` names the URL and the fix; the worker probe is empty."""
    from deployments import prefect_api

    url = f"http://127.0.0.1:{free_port()}/api"
    start = time.monotonic()
    assert prefect_api.pool_workers(url, "trainflow") == []
    with pytest.raises(ServiceUnreachableError) as error:
        prefect_api.deployments_overview(url)
    assert time.monotonic() - start < 20
    assert url in str(error.value) and "trainflow up" in str(error.value)


def test_cli_run_with_prefect_api_down_fails_at_once(home):
    url = f"http://127.0.0.1:{free_port()}/api"
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainflow",
            "run",
            "--config",
            str(REPO_ROOT / "configs/smoke.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_API_URL": url},
        cwd=home,
    )
    assert proc.returncode == 2  # the user starts the server or unsets the URL
    assert time.monotonic() - start < 60
    assert url in proc.stderr and "trainflow up" in proc.stderr


def test_run_deployment_without_a_stack_suggests_up(home):
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow", "run", "--deployment", "smoke"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINFLOW_HOME": str(home)},
        cwd=home,
    )
    assert proc.returncode == 2  # the user starts the stack
    assert "trainflow up" in proc.stderr


def test_mlflow_server_down_names_the_url_and_the_fix():
    from training.tracking.store import check_reachable

    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as error:
        check_reachable(url)
    assert time.monotonic() - start < 10
    assert url in str(error.value) and "trainflow up" in str(error.value)


def test_s3_endpoint_down_fails_fast_naming_the_endpoint(monkeypatch):
    from training.storage import exists

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as error:
        exists("s3://trainflow-unit/data/manifest.json", endpoint)
    assert time.monotonic() - start < 30
    assert endpoint in str(error.value) and "storage.endpoint_url" in str(error.value)
    assert error.value.retriable  # a task meeting it is retried by Prefect


# ------------------------------------------------------------------------------- deployments


def test_deployment_parameters_are_the_validated_config_files():
    from deployments.deploy import DEPLOYMENTS, spec, spec_parameters
    from training.config.overrides import load_config

    assert {d.name for d in DEPLOYMENTS} >= {"nightly", "smoke"}
    nightly = spec("nightly")
    assert nightly.cron and nightly.timezone and not nightly.paused
    smoke = spec("smoke")
    assert smoke.interval and smoke.paused
    assert spec_parameters(smoke) == {
        "config": load_config(REPO_ROOT / "configs/smoke.yaml").model_dump(mode="json")
    }
    with pytest.raises(ConfigError, match="nightly, smoke"):
        spec("weekly")


def _state_on(host: str, port: int) -> stack_state.StackState:
    from deployments.exposure import client_host

    return stack_state.StackState(
        home="/tmp/h",
        pool="trainflow",
        prefect_url=f"http://{client_host(host)}:{port}",
        mlflow_url="http://127.0.0.1:5000",
        artifacts_destination="/tmp/h/mlartifacts",
        host=host,
    )


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "http://127.0.0.1:4291/api"),
        ("0.0.0.0", "http://127.0.0.1:4291/api"),  # this machine's clients reach a wildcard here
        ("192.168.7.9", "http://192.168.7.9:4291/api"),
    ],
)
def test_prefect_ui_announces_the_api_on_the_port_and_host_up_was_given(host, expected):
    """The server's /ui-settings announced 127.0.0.1:4200 whatever --port was."""
    caller = {"PREFECT_API_URL": "http://elsewhere:1/api", "PREFECT_UI_API_URL": "http://old/api"}
    env = stack.prefect_server_environment(caller, _state_on(host, 4291))
    assert env["PREFECT_SERVER_UI_API_URL"] == expected
    assert "PREFECT_API_URL" not in env and "PREFECT_UI_API_URL" not in env
    assert env["PREFECT_UI_ENABLED"] == "true"


def test_prefect_reads_the_ui_api_url_we_set(monkeypatch):
    """The setting's name is Prefect's: its settings model turns it into /ui-settings' api_url."""
    from prefect.settings import Settings

    monkeypatch.setenv("PREFECT_SERVER_UI_API_URL", "http://127.0.0.1:4291/api")
    assert Settings().server.ui.api_url == "http://127.0.0.1:4291/api"
