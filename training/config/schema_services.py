"""The ``gate``, ``mlflow``, ``ray`` and ``storage`` sections: where runs go and what decides."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator

from training.config.schema_base import Section
from training.metrics import TestMetric


class GateConfig(Section):
    """When a new model version may take the champion alias."""

    metric: TestMetric = Field(
        "test_accuracy", description="test metric compared with the champion's (regression: rmse)"
    )
    min_delta: float = Field(0.0, ge=0, description="improvement required to move champion")
    rule: Literal["point", "interval"] = Field(
        "interval",
        description="interval: promote only when the improvement's confidence interval lies "
        "above min_delta; point: when the measured improvement does",
    )
    confidence: float = Field(0.95, gt=0.5, lt=1, description="the interval's confidence")
    bootstrap_samples: int = Field(1000, ge=100, le=100_000, description="paired resamples")
    seed: int = Field(0, description="seed of the bootstrap's resamples")
    max_slice_drop: float | None = Field(
        0.1,
        ge=0,
        description="a class's recall (classifiers) or a slice column value's metric may drop "
        "by at most this much; null: no slice check",
    )
    min_slice_rows: int = Field(20, ge=1, description="smaller slices are not judged")
    slice_columns: list[str] = Field(
        default_factory=list, description="raw-table columns whose values are slices"
    )
    on_incompatible: Literal["promote", "keep"] = Field(
        "promote",
        description="when the champion cannot score the new rows (columns gone, other classes)",
    )
    max_drift: float | None = Field(
        None,
        ge=0,
        description="largest population stability index of any column of the new training data "
        "against the champion's (docs/gate.md); null: drift is measured and logged, never judged",
    )
    on_drift: Literal["block", "warn"] = Field(
        "block",
        description="a column drifted beyond max_drift: block keeps the champion, warn promotes "
        "and says so",
    )


class MlflowConfig(Section):
    """Tracking and registry."""

    tracking_uri: str | None = Field(
        None, description="MLflow server URL or sqlite:///...; default: sqlite in the home"
    )
    experiment: str = Field("trainflow", min_length=1, description="MLflow experiment name")
    registered_model: str | None = Field(
        None,
        min_length=1,
        description="registered model name; default: the data's (digits for builtin:digits, "
        "else the file or directory name)",
    )
    gate: GateConfig = Field(default_factory=GateConfig)
    system_metrics_interval_s: float = Field(
        10.0,
        ge=0,
        description="seconds between samples of each training node's CPU, memory, disk, network "
        "(and GPU) use, logged to the train run as system/node_<index>/...; 0: none",
    )
    outage_grace_s: float = Field(
        600.0,
        ge=0,
        description="how long a stage waits for an MLflow server that stopped answering "
        "before the run stops (the stage then runs again); 0: no wait",
    )
    log_checkpoints: bool = Field(
        True,
        description="log each checkpoint the final training keeps (train.checkpoint.num_to_keep) "
        "as an MLflow logged model <registered model>-epoch-<N> with its epoch's metrics; the "
        "registered version is the best one's. Each is a copy of the weights in the MLflow "
        "artifact store: false for large models",
    )


class RayConfig(Section):
    """Where Ray runs."""

    address: str | None = Field(
        None, description="existing cluster address (ray://... or host:port); none = local"
    )
    num_cpus: int = Field(
        4, ge=1, description="logical CPUs of the local instance (more than cores avoids stalls)"
    )
    ship_code: bool = Field(
        False,
        description="true: upload training/ to the cluster (runtime_env py_modules); "
        "false: the nodes have trainflow installed",
    )
    object_store_mb: int | None = Field(
        None,
        ge=128,
        description="object store of the local instance in MiB; none = Ray's default "
        "(30% of RAM); a cluster's nodes set their own",
    )


class StorageConfig(Section):
    """Processed data, checkpoints and Tune state."""

    root: str | None = Field(
        None, description="absolute path or s3://bucket/prefix; default: <home>/storage"
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint override")
    retry_attempts: int = Field(
        10,
        ge=1,
        le=50,
        description="tries per S3 request of a checkpoint, Tune state or manifest write, each "
        "after a random wait of up to 1, 2, 4 ... 20 s (10: ~80 s in all, riding out a storage "
        "outage of a minute); split files get Ray Data's own retries; the first look at a "
        "store keeps 3 so that one that is not there fails fast",
    )

    @field_validator("root")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is None or "://" in value:
            return value
        if not os.path.isabs(value):
            raise ValueError(
                f"{value!r} is relative; give an absolute path or an s3://bucket/prefix URI"
            )
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        # The config is the flow's parameter: Prefect stores it as given and MLflow logs it.
        if value and "@" in value.split("://", 1)[-1].split("/", 1)[0]:
            raise ValueError(
                "holds credentials (user:secret@); give the endpoint only, e.g. "
                "http://127.0.0.1:9000, and the keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
            )
        return value
