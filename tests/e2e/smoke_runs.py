"""The smoke pipeline's shared parts: its config, the first run's canary credentials, the Ray
sessions a home holds (tests/e2e/conftest.py)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")

# The first run carries canary credentials; none may be written
# anywhere, Ray's session logs included.
CANARIES = {
    "AWS_ACCESS_KEY_ID": "AKIACANARY7QX2LKEYID",
    "AWS_SECRET_ACCESS_KEY": "canary-secret-3f9d1c0b7e5a",
    "AWS_SESSION_TOKEN": "canary-session-token-8b2e",
    "MLFLOW_TRACKING_TOKEN": "canary-mlflow-token-6a4f",
    "MLFLOW_TRACKING_PASSWORD": "canary-mlflow-password-1c9e",
    "PREFECT_API_KEY": "canary-prefect-key-77d1",
}


def ray_sessions(home: Path) -> list[Path]:
    """The Ray sessions under the home: <home>/ray is the runs' Ray temp dir, or a link to it
    when the home is too deep for Unix socket paths (read through the link)."""
    return [p for p in (home / "ray").resolve().iterdir() if p.name.startswith("session_2")]
