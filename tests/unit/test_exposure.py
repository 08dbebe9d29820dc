"""`trainflow up --host`: loopback needs nothing; any other host needs both servers' credentials."""

from __future__ import annotations

import pytest

from deployments.exposure import StackAuth, UnprotectedHostError, client_host, is_loopback

CREDENTIALS = {
    "PREFECT_SERVER_API_AUTH_STRING": "admin:prefect-pw",
    "MLFLOW_TRACKING_USERNAME": "admin",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pw",
}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_credentials(host, monkeypatch):
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    assert is_loopback(host)
    assert StackAuth.required_for(host) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "trainflow.example.org"])
@pytest.mark.parametrize("missing", list(CREDENTIALS))
def test_any_other_host_is_refused_without_each_credential(host, missing, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    monkeypatch.delenv(missing)
    with pytest.raises(UnprotectedHostError) as refused:
        StackAuth.required_for(host)
    message = str(refused.value)
    assert host in message and missing.split()[0] in message and "127.0.0.1" in message
    assert "prefect-pw" not in message and "mlflow-pw" not in message
    assert refused.value.user_error


def test_with_credentials_the_servers_and_clients_get_them(tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    auth = StackAuth.required_for("0.0.0.0")
    assert auth.prefect_server_env() == {"PREFECT_SERVER_API_AUTH_STRING": "admin:prefect-pw"}
    assert auth.client_env()["PREFECT_API_AUTH_STRING"] == "admin:prefect-pw"
    server = auth.mlflow_server_env(tmp_path)
    assert server["MLFLOW_AUTH_ADMIN_PASSWORD"] == "mlflow-pw"
    assert len(server["MLFLOW_FLASK_SERVER_SECRET_KEY"]) == 64
    config = (tmp_path / "mlflow-auth.ini").read_text()
    assert "mlflow-pw" not in config and "prefect-pw" not in config  # no secret on disk
    assert str(tmp_path / "mlflow-auth.db") in config


def test_a_prefect_auth_string_without_a_colon_is_refused(monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", "justapassword")
    with pytest.raises(UnprotectedHostError):
        StackAuth.required_for("0.0.0.0")


def test_clients_of_a_wildcard_bind_use_loopback():
    assert client_host("0.0.0.0") == "127.0.0.1"
    assert client_host("::") == "127.0.0.1"
    assert client_host("10.1.2.3") == "10.1.2.3"
