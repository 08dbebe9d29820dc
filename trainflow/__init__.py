"""trainflow: a Prefect-orchestrated Ray Data / Train / Tune pipeline tracked in MLflow."""

__version__ = "0.1.0"
