"""The ``sweep`` section: Ray Tune with ASHA over the same loop."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from training.config.schema_base import Section
from training.config.search_space import SearchDomain
from training.metrics import ValMetric, direction


class AshaConfig(Section):
    """ASHA early stopping; one training_iteration is one epoch."""

    max_t: int = Field(10, ge=1, description="epochs a trial may run at most")
    grace_period: int = Field(2, ge=1, description="epochs before a trial can be stopped")
    reduction_factor: float = Field(3, gt=1, description="keep 1/reduction_factor per rung")


def default_search_space() -> dict[str, SearchDomain]:
    return {
        "train.lr": SearchDomain(loguniform=(1e-3, 2e-2)),
        "train.weight_decay": SearchDomain(loguniform=(1e-5, 1e-2)),
        "model.dropout": SearchDomain(uniform=(0.0, 0.3)),
        "train.batch_size": SearchDomain(choice=[32, 64, 128]),
    }


class SweepConfig(Section):
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
    search_space: dict[str, SearchDomain] = Field(default_factory=default_search_space)
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
