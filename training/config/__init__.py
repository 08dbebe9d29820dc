"""The one schema of every setting, and its defaults.

YAML files and ``--set a.b=value`` hold overrides only (``overrides`` loads them); every default
lives in the ``schema*`` modules, one per section. Everything is validated before any cluster,
server or file is touched. ``dotted`` walks ``a.b.c`` keys; ``search_space`` holds the sweep's
domains; ``capacity`` checks the workers fit a local instance.
"""

from training.config.model_name import registered_model_name
from training.config.overrides import load_config, parse_override
from training.config.schema import PipelineConfig, validate_config
from training.config.schema_base import BUILTIN_DIGITS, DIGITS_IMAGE_SHAPE
from training.config.schema_data import DataConfig, SplitConfig
from training.config.schema_services import GateConfig, MlflowConfig, RayConfig, StorageConfig
from training.config.schema_sweep import AshaConfig, SweepConfig
from training.config.schema_train import CheckpointSettings, ModelConfig, TrainConfig
from training.config.search_space import SearchDomain

__all__ = [
    "BUILTIN_DIGITS",
    "DIGITS_IMAGE_SHAPE",
    "AshaConfig",
    "CheckpointSettings",
    "DataConfig",
    "GateConfig",
    "MlflowConfig",
    "ModelConfig",
    "PipelineConfig",
    "RayConfig",
    "SearchDomain",
    "SplitConfig",
    "StorageConfig",
    "SweepConfig",
    "TrainConfig",
    "load_config",
    "parse_override",
    "registered_model_name",
    "validate_config",
]
