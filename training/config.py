"""The one schema of every setting, and its defaults.

YAML files and ``--set a.b=value`` hold overrides only (overrides.py loads them); every default
lives here. Everything is validated before any cluster, server or file is touched.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training.capacity import check_fits_local_instance
from training.dotted import describe_errors, flatten, set_dotted
from training.errors import ConfigError
from training.metrics import TestMetric, ValMetric, direction, follow_task
from training.search_space import SearchDomain, check_search_key

BUILTIN_DIGITS = "builtin:digits"
DIGITS_IMAGE_SHAPE = [1, 8, 8]
_Width = Annotated[int, Field(gt=0)]
_FACTORY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class _Section(BaseModel):
    # Unknown keys are typos: refuse them instead of silently ignoring them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SplitConfig(_Section):
    """Fractions of rows held out, assigned by a seeded hash of each row."""

    val: float = Field(0.15, gt=0, lt=1, description="fraction of rows for validation")
    test: float = Field(0.15, gt=0, lt=1, description="fraction of rows for the final test")
    seed: int = Field(0, ge=0, description="seed of the row hash that assigns splits")

    @model_validator(mode="after")
    def _leave_rows_for_training(self) -> SplitConfig:
        if self.val + self.test >= 0.9:
            raise ValueError(
                f"val + test = {self.val + self.test:.2f} leaves too few rows for training; "
                "keep data.split.val + data.split.test below 0.9"
            )
        return self


class DataConfig(_Section):
    """Where the table is and which columns mean what."""

    source: str = Field(
        BUILTIN_DIGITS,
        description="builtin:digits|diabetes, or a parquet/CSV file or directory (local or s3://)",
    )
    format: Literal["auto", "parquet", "csv"] = Field(
        "auto", description="file format; auto infers it from the suffix"
    )
    label_column: str = Field("label", min_length=1, description="the column to predict")
    feature_columns: list[str] | None = Field(
        None, description="numeric feature columns; default: every other numeric column"
    )
    image_column: str | None = Field(
        None, description="a column of fixed-size numeric arrays, used instead of features"
    )
    image_shape: list[int] | None = Field(
        None, description="shape (C, H, W) of one image; needed by model.kind=cnn"
    )
    task: Literal["auto", "classification", "regression"] = Field(
        "auto", description="auto: a float label with many values is a regression, else classes"
    )
    split: SplitConfig = Field(default_factory=SplitConfig)

    @field_validator("image_shape")
    @classmethod
    def _positive_shape(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (len(value) != 3 or any(d <= 0 for d in value)):
            raise ValueError(
                "must be three positive ints [channels, height, width], e.g. [1, 8, 8]"
            )
        return value

    @model_validator(mode="after")
    def _features_or_image(self) -> DataConfig:
        if self.feature_columns is not None and self.image_column is not None:
            raise ValueError("set either data.feature_columns or data.image_column, not both")
        if self.feature_columns is not None and len(self.feature_columns) == 0:
            raise ValueError("data.feature_columns is empty; list columns or leave it unset")
        if self.feature_columns is not None and self.label_column in self.feature_columns:
            raise ValueError(f"label column {self.label_column!r} is also in data.feature_columns")
        return self


class ModelConfig(_Section):
    """The network: mlp (features), cnn or resnet18 (images, data.image_shape), or custom."""

    kind: Literal["mlp", "cnn", "resnet18", "custom"] = Field("mlp", description="network")
    factory: str | None = Field(None, description='custom: "package.module:function"')
    params: dict[str, Any] = Field({}, description="custom: the factory's kwargs (sweepable)")
    hidden_sizes: list[_Width] = Field([128, 64], min_length=1, description="MLP widths")
    channels: list[_Width] = Field([16, 32], min_length=1, description="CNN conv channels")
    cnn_hidden: int = Field(64, gt=0, description="width of the CNN's dense layer")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout probability")

    @model_validator(mode="after")
    def _factory_for_custom(self) -> ModelConfig:
        if (self.kind == "custom") != (self.factory is not None):
            raise ValueError("model.factory goes with model.kind=custom, and custom needs it")
        if self.factory and not _FACTORY.fullmatch(self.factory):
            raise ValueError(f"model.factory={self.factory!r}: give 'package.module:function'")
        return self


class CheckpointSettings(_Section):
    """Ray Train checkpoint retention."""

    num_to_keep: int = Field(2, ge=1, description="checkpoints kept per run (best by score)")
    score_attribute: str = Field("val_accuracy", description="metric that ranks checkpoints")
    score_order: Literal["max", "min"] = Field("max", description="max | min")
    every_n_batches: int = Field(
        0, ge=0, description="final training: also checkpoint every N batches (0 = epoch ends)"
    )


class TrainConfig(_Section):
    """Final distributed training (Ray Train TorchTrainer) and the loop's hyperparameters."""

    num_workers: int | tuple[int, int] = Field(
        2, description="DDP workers: an int, or [min, max] for elastic training"
    )
    use_gpu: bool = Field(False, description="one GPU per worker (backend auto -> nccl)")
    resources_per_worker: dict[str, float] = Field(
        default_factory=lambda: {"CPU": 1.0}, description="Ray resources of each worker"
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="ddp | fsdp (sharded params)")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl with GPUs, else gloo"
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16: forward passes under torch.autocast(bfloat16)"
    )
    elastic_resize_interval_s: float = Field(
        60.0, gt=0, description="elastic [min, max]: how often a running group looks for nodes"
    )
    timeout_s: int = Field(1800, gt=0, description="torch.distributed init/collective timeout")
    shard_cache_mb: int = Field(
        512,
        ge=0,
        description="a worker keeps its data shard in memory (on its GPU with use_gpu) when it "
        "fits in this many MiB, read once through Ray Data; 0 = stream every epoch",
    )
    max_epochs: int = Field(20, ge=1, description="epochs of the final training")
    batch_size: int = Field(64, ge=1, description="global batch size (split across workers)")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0, description="AdamW weight decay")
    lr_schedule: Literal["constant", "cosine"] = Field("cosine", description="constant | cosine")
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    max_failures: int = Field(1, ge=-1, description="worker-group restarts allowed; -1 = forever")
    seed: int = Field(0, ge=0, description="seed of init, shuffling and dropout")

    @field_validator("num_workers")
    @classmethod
    def _valid_workers(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(value, int):
            if value < 1:
                raise ValueError("must be >= 1")
            return value
        low, high = value
        if low < 1 or high < low:
            raise ValueError("elastic [min, max] needs 1 <= min <= max")
        return (low, high) if low != high else low

    @field_validator("resources_per_worker")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        if any(v < 0 for v in value.values()):
            raise ValueError("resource amounts must be >= 0")
        return value

    @model_validator(mode="after")
    def _gpu_backend(self) -> TrainConfig:
        if self.backend == "nccl" and not self.use_gpu:
            raise ValueError("train.backend=nccl needs train.use_gpu=true; use gloo on CPUs")
        return self

    @property
    def torch_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.use_gpu else "gloo"

    @property
    def max_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    @property
    def min_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]


class AshaConfig(_Section):
    """ASHA early stopping; one training_iteration is one epoch."""

    max_t: int = Field(10, ge=1, description="epochs a trial may run at most")
    grace_period: int = Field(2, ge=1, description="epochs before a trial can be stopped")
    reduction_factor: float = Field(3, gt=1, description="keep 1/reduction_factor per rung")


def _default_search_space() -> dict[str, SearchDomain]:
    return {
        "train.lr": SearchDomain(loguniform=(1e-3, 2e-2)),
        "train.weight_decay": SearchDomain(loguniform=(1e-5, 1e-2)),
        "model.dropout": SearchDomain(uniform=(0.0, 0.3)),
        "train.batch_size": SearchDomain(choice=[32, 64, 128]),
    }


class SweepConfig(_Section):
    """Ray Tune sweep with ASHA over the same loop; search-space keys are config paths."""

    enabled: bool = Field(True, description="false: train once with the configured values")
    num_samples: int = Field(8, ge=1, description="trials sampled from the search space")
    max_concurrent_trials: int = Field(2, ge=1, description="trials running at once")
    workers_per_trial: int = Field(
        1, ge=1, description="1: plain Tune function trial; >1: each trial drives a TorchTrainer"
    )
    metric: ValMetric = Field("val_accuracy", description="ranked metric (regression: val_rmse)")
    mode: Literal["max", "min"] = Field("max", description="max | min")
    asha: AshaConfig = Field(default_factory=AshaConfig)
    search_space: dict[str, SearchDomain] = Field(default_factory=_default_search_space)
    seed: int = Field(0, ge=0, description="seed of the sampled configurations")
    searcher: Literal["random", "optuna"] = Field(
        "random", description="random | optuna (Optuna's TPE, seeded with sweep.seed)"
    )
    sample_rows: int | None = Field(
        200_000,
        ge=1,
        description="trials' train rows: a seeded sample (val in proportion); null=all",
    )
    sample_mb: int | None = Field(
        256,
        ge=1,
        description="and at most this many MiB of train features in memory (fewer rows of wide "
        "data such as images); null=rows only",
    )
    gpus_per_trial: float | None = Field(
        None,
        gt=0,
        description="GPUs of each function trial (a fraction <= 1, or an integer), or of each "
        "worker of a TorchTrainer trial (an integer); default: 1 with train.use_gpu",
    )

    @field_validator("gpus_per_trial")
    @classmethod
    def _whole_or_share(cls, value: float | None) -> float | None:
        if value is not None and value > 1 and value != int(value):
            raise ValueError("must be a share of one GPU (0 < x <= 1) or a whole number of GPUs")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        gpus = self.gpus_per_trial
        if self.workers_per_trial > 1 and gpus is not None and gpus != int(gpus):
            raise ValueError(
                f"sweep.gpus_per_trial={gpus:g} with sweep.workers_per_trial > 1 is each DDP "
                "worker's GPUs: a whole number (nccl refuses two ranks on one GPU)"
            )
        if self.asha.grace_period > self.asha.max_t:
            raise ValueError(
                f"sweep.asha.grace_period ({self.asha.grace_period}) must be <= "
                f"sweep.asha.max_t ({self.asha.max_t})"
            )
        expected_mode = direction(self.metric)
        if self.mode != expected_mode:
            raise ValueError(f"sweep.metric={self.metric} needs sweep.mode={expected_mode}")
        return self


class GateConfig(_Section):
    """When a new model version may take the champion alias."""

    metric: TestMetric = Field(
        "test_accuracy", description="test metric compared with the champion's (regression: rmse)"
    )
    min_delta: float = Field(0.0, ge=0, description="improvement required to move champion")


class MlflowConfig(_Section):
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


class RayConfig(_Section):
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


class StorageConfig(_Section):
    """Processed data, checkpoints and Tune state."""

    root: str | None = Field(
        None, description="absolute path or s3://bucket/prefix; default: <home>/storage"
    )
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint override")

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


class PipelineConfig(_Section):
    """Everything the pipeline needs; the flow's one parameter."""

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        if self.model.kind in ("cnn", "resnet18") and self.data.image_shape is None:
            if self.data.source == BUILTIN_DIGITS:
                self.data.image_shape = list(DIGITS_IMAGE_SHAPE)
            else:
                raise ValueError(
                    f"model.kind={self.model.kind} needs data.image_shape, e.g. [1, 28, 28]"
                )
        if self.data.task != "auto":  # a regression ranks, keeps and gates by RMSE
            follow_task(self, self.data.task)
        if self.ray.address is None:
            check_fits_local_instance(self.train, self.sweep, self.ray)
        if self.sweep.gpus_per_trial is not None and not self.train.use_gpu:
            raise ValueError("sweep.gpus_per_trial needs train.use_gpu=true")
        for key, domain in self.sweep.search_space.items():
            check_search_key(self, key, domain)
        return self

    def with_overrides(self, overrides: dict[str, Any]) -> PipelineConfig:
        """A validated copy with dotted-path overrides applied (e.g. a trial's params)."""
        raw = self.model_dump(mode="json")
        for key, value in overrides.items():
            set_dotted(raw, key, value)
        return validate_config(raw)

    def flat(self) -> dict[str, Any]:
        """Dotted key -> value, for MLflow params (search-space entries without empty slots)."""
        raw = self.model_dump(mode="json")
        raw["sweep"]["search_space"] = {
            key: domain.model_dump(mode="json", exclude_none=True)
            for key, domain in self.sweep.search_space.items()
        }
        return flatten(raw)


#: Suffixes a data file's name loses in the model's name (``claims.csv.gz`` -> ``claims``).
_DATA_SUFFIXES = {".parquet", ".pq", ".csv", ".tsv", ".json", ".jsonl", ".gz", ".bz2", ".zst"}


def registered_model_name(config: PipelineConfig) -> str:
    """The registered model's name: ``mlflow.registered_model`` where set, else the data's own
    name: a built-in set's (``builtin:digits`` -> ``digits``), else the file's or directory's
    (``/data/penguins.parquet`` -> ``penguins``, ``s3://b/claims/`` -> ``claims``), kept to the
    characters safe in a ``models:/NAME@alias`` URI."""
    if config.mlflow.registered_model:
        return config.mlflow.registered_model
    source = config.data.source
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
    else:
        path = source.split("://")[-1] if "://" in source else os.path.abspath(source)
        parts = [p for p in re.split(r"[/\\]", path) if p]
        parts = [p for p in parts if not any(c in p for c in "*?[")] or ["data"]  # a glob
        name = parts[-1]
        while os.path.splitext(name)[1].lower() in _DATA_SUFFIXES:
            name = os.path.splitext(name)[0]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-._")
    return name or "trainflow-model"


def validate_config(raw: dict[str, Any]) -> PipelineConfig:
    """Validate a raw dict; raise ConfigError naming every bad key and what is allowed."""
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None
