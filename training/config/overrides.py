"""Loading a config: the defaults, then a YAML file, then ``--set a.b=value`` overrides.

The file and the overrides hold overrides only; every default lives in config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from training.config.dotted import set_dotted
from training.config.schema import PipelineConfig, validate_config
from training.errors import ConfigError


def parse_override(item: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", value), the value read as YAML (numbers, lists, null...)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.lr=0.01")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {item!r}: value is not valid YAML ({exc})") from None
    return key.strip(), value


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The sections of a YAML config file (empty file: none)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass an existing YAML file")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections")
    return loaded or {}


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> PipelineConfig:
    """Defaults, then the YAML file, then ``--set`` overrides; validated as a whole."""
    raw = read_config_file(path) if path is not None else {}
    for item in overrides or []:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return validate_config(raw)
