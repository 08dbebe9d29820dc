"""The one switch of trainflow's start-up speed-ups (read here, below the CLI, because the
MLflow store seeds its database from a template too). trainflow/startup.py lists what it turns
off."""

from __future__ import annotations

import os

SWITCH_ENV = "TRAINFLOW_FAST_START"


def enabled() -> bool:
    """False when ``TRAINFLOW_FAST_START=0``: every start-up speed-up is off."""
    return os.environ.get(SWITCH_ENV, "1") != "0"
