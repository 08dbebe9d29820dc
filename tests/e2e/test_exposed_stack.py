"""`trainflow up --host 0.0.0.0`: refused without credentials; with them, real
servers that refuse a request without credentials and serve it with them. Requests go to
127.0.0.1 only."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import pytest
from cli_runner import free_port, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CREDENTIALS = {
    "PREFECT_SERVER_API_AUTH_STRING": "ops:prefect-e2e-pw",
    "MLFLOW_TRACKING_USERNAME": "ops",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-e2e-pw",
}


def _status(
    url: str, user: str | None = None, password: str | None = None, post: bool = False
) -> int:
    """The HTTP status of a GET (or a JSON POST of ``{}``), with basic auth when given."""
    request = urllib.request.Request(url, data=b"{}" if post else None)
    if post:
        request.add_header("Content-Type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        # Generous: MLflow's auth app hashes passwords with scrypt, and its first authorised
        # request took over 10 s on 2 busy cores.
        with urllib.request.urlopen(request, timeout=90) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_up_on_a_wildcard_host_without_credentials_starts_nothing(tmp_path):
    home = tmp_path / "home"
    env = {name: "" for name in CREDENTIALS}
    proc = run_cli(home, "up", "--host", "0.0.0.0", "--prefect-port", str(free_port()), **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "refusing to listen on 0.0.0.0 without authentication" in proc.stderr
    assert "PREFECT_SERVER_API_AUTH_STRING" in proc.stderr
    assert not (home / "stack" / "state.json").exists()


@pytest.fixture(scope="module")
def exposed(tmp_path_factory):
    home = tmp_path_factory.mktemp("exposed-home")
    ports = {"prefect": free_port(), "mlflow": free_port()}
    proc = run_cli(
        home,
        "up",
        "--host",
        "0.0.0.0",
        "--prefect-port",
        str(ports["prefect"]),
        "--mlflow-port",
        str(ports["mlflow"]),
        "--timeout",
        "240",
        timeout=300,
        **CREDENTIALS,
    )
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield {"home": home, "ports": ports, "stdout": proc.stdout}
    finally:
        run_cli(home, "down", timeout=120)


def test_the_servers_refuse_requests_without_credentials(exposed):
    prefect = f"http://127.0.0.1:{exposed['ports']['prefect']}/api"
    mlflow = f"http://127.0.0.1:{exposed['ports']['mlflow']}"
    assert "with authentication on both servers" in exposed["stdout"]
    flows = f"{prefect}/flows/count"
    experiments = f"{mlflow}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _status(f"{prefect}/health") == 200  # health probes stay open (orchestrators)

    assert _status(flows, post=True) == 401
    assert _status(flows, "ops", "wrong", post=True) == 401
    assert _status(flows, "ops", "prefect-e2e-pw", post=True) == 200
    assert _status(experiments) == 401
    assert _status(experiments, "ops", "wrong") == 401
    assert _status(experiments, "ops", "mlflow-e2e-pw") == 200


def test_the_worker_registers_through_the_auth_and_no_secret_is_on_disk(exposed):
    """`up` only returns once its worker is seen in the pool (through the guarded API); the
    credentials live in the processes' environments, not in any file of the home."""
    home = exposed["home"]
    state = json.loads((home / "stack" / "state.json").read_text())
    assert state["host"] == "0.0.0.0" and set(state["parts"]) == {"prefect", "mlflow", "worker"}
    time.sleep(1)
    secrets = [b"prefect-e2e-pw", b"mlflow-e2e-pw"]
    files = [p for p in home.rglob("*") if p.is_file()]
    assert [f"{p}" for p in files for s in secrets if s in p.read_bytes()] == []
