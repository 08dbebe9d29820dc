"""The whole configuration: its sections together, and what is checked across them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, model_validator

from training.config.capacity import check_fits_local_instance
from training.config.causal_lm import check_causal_lm
from training.config.dotted import describe_errors, flatten, set_dotted
from training.config.lightning import check_lightning
from training.config.schema_base import BUILTIN_DIGITS, DIGITS_IMAGE_SHAPE, Section
from training.config.schema_data import DataConfig
from training.config.schema_services import MlflowConfig, RayConfig, StorageConfig
from training.config.schema_sweep import SweepConfig, default_search_space
from training.config.schema_train import ModelConfig, TrainConfig
from training.config.search_space import check_search_key
from training.errors import ConfigError
from training.metrics import follow_task


class PipelineConfig(Section):
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
        check_causal_lm(self, default_search_space())
        if self.train.engine == "hf_trainer" and self.model.kind != "hf":
            raise ValueError(
                f"train.engine=hf_trainer trains Hugging Face models: it needs model.kind=hf "
                f"(not {self.model.kind}); use train.engine=loop"
            )
        if self.train.engine == "hf_trainer" and self.data.task == "causal_lm":
            raise ValueError(
                "train.engine=hf_trainer trains sequence classifiers and regressions; a "
                "data.task=causal_lm model trains with train.engine=loop"
            )
        if self.train.engine == "function" and self.model.kind != "custom":
            raise ValueError(
                "train.engine=function needs model.kind: custom with model.factory: the module "
                "your train.function trains, which trainflow rebuilds to evaluate and serve its "
                "checkpoint's model.pt"
            )
        if self.train.engine == "lightning":
            check_lightning(self)
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


def validate_config(raw: dict[str, Any]) -> PipelineConfig:
    """Validate a raw dict; raise ConfigError naming every bad key and what is allowed."""
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None
