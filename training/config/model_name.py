"""The registered model's default name, taken from the data it is trained on."""

from __future__ import annotations

import os
import re

from training.config.schema import PipelineConfig

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
