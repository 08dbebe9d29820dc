"""Process environment for the CLI, set before prefect or ray are imported."""

from __future__ import annotations

import os

from training.storage import trainflow_home


def prepare_environment() -> None:
    """Keep Prefect's state under the trainflow home and every service quiet and offline.

    Only defaults: anything the user exported wins.
    """
    home = trainflow_home()
    home.mkdir(parents=True, exist_ok=True)
    defaults = {
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
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
