"""Listening beyond loopback: `trainflow up --host` only with authentication on both servers.

The stack binds 127.0.0.1. Any other host (0.0.0.0, a LAN address) serves anyone who reaches it,
so ``up`` refuses unless credentials are in the environment: Prefect's server auth string
(``PREFECT_SERVER_API_AUTH_STRING`` or ``PREFECT_API_AUTH_STRING``, ``user:password``) and an
MLflow admin for its basic-auth app (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``,
what MLflow's clients send). The credentials go to the servers' environments only — never to a
command line, the state file or a log.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from deployments.stack_state import StackError

WILDCARDS = ("0.0.0.0", "::")


class UnprotectedHostError(StackError):
    """A non-loopback host was asked for without the credentials to guard it."""

    user_error = True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def client_host(host: str) -> str:
    """Where this machine's own clients reach a server bound to ``host``."""
    return "127.0.0.1" if host in WILDCARDS else host


@dataclass(frozen=True)
class StackAuth:
    """The credentials that guard an exposed stack (from the environment)."""

    prefect_auth_string: str
    mlflow_username: str
    mlflow_password: str

    @classmethod
    def required_for(cls, host: str) -> StackAuth | None:
        """None for a loopback host; the environment's credentials, or a refusal, otherwise."""
        if is_loopback(host):
            return None
        prefect = os.environ.get("PREFECT_SERVER_API_AUTH_STRING") or os.environ.get(
            "PREFECT_API_AUTH_STRING"
        )
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        password = os.environ.get("MLFLOW_TRACKING_PASSWORD")
        missing = [
            name
            for name, value in (
                ("PREFECT_SERVER_API_AUTH_STRING (user:password)", prefect and ":" in prefect),
                ("MLFLOW_TRACKING_USERNAME", user),
                ("MLFLOW_TRACKING_PASSWORD", password),
            )
            if not value
        ]
        if missing:
            raise UnprotectedHostError(
                f"refusing to listen on {host} without authentication: anyone who reaches it "
                f"could run and read everything. Set {', '.join(missing)} in the environment "
                "(Prefect's server auth string and the MLflow admin), or leave --host at "
                "127.0.0.1"
            )
        return cls(prefect, user, password)

    def prefect_server_env(self) -> dict[str, str]:
        return {"PREFECT_SERVER_API_AUTH_STRING": self.prefect_auth_string}

    def client_env(self) -> dict[str, str]:
        """What the worker, its flow runs and this CLI send to the servers."""
        return {
            "PREFECT_API_AUTH_STRING": self.prefect_auth_string,
            "MLFLOW_TRACKING_USERNAME": self.mlflow_username,
            "MLFLOW_TRACKING_PASSWORD": self.mlflow_password,
        }

    def mlflow_server_env(self, stack_dir: Path) -> dict[str, str]:
        """MLflow's basic-auth app: its user database beside the stack's state, the admin from
        the environment, and a CSRF key made for this start (it never leaves the process)."""
        config = stack_dir / "mlflow-auth.ini"
        config.write_text(
            "[mlflow]\n"
            "default_permission = READ\n"
            f"database_uri = sqlite:///{stack_dir / 'mlflow-auth.db'}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(config),
            "MLFLOW_AUTH_ADMIN_USERNAME": self.mlflow_username,
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.mlflow_password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
        }
