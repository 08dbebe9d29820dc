"""Lineage in MLflow: the data a run read (``log_input``) and what made a model version.

Datasets are logged as MLflow dataset inputs named ``<source> [<split>]``, whose digest is the
data fingerprint (input bytes + preprocessing config) and whose source is the split's location.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from training.manifest import Manifest
from training.platform.secrets import redact
from training.tracking.provenance import git_commit
from training.tracking.runs import Tracker


def config_hash(config) -> str:
    """A short hash of the whole resolved configuration (as JSON, keys sorted)."""
    text = json.dumps(config.model_dump(mode="json"), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dataset_name(manifest: Manifest, split: str) -> str:
    """The name a split's dataset is logged under (its digest is the data fingerprint)."""
    return f"{redact(manifest.source)} [{split}]"


def log_datasets(tracker: Tracker, run_id: str, manifest: Manifest, splits: list[str]) -> None:
    """Log the splits a run read as its MLflow dataset inputs (context = the split)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.types import ColSpec, DataType, Schema

    from training.model.trainflow_pyfunc.transform import input_columns

    spec = manifest.spec
    columns = [spec.image_column] if spec.image_column else input_columns(spec.to_dict())
    # Every raw column read (a table of text or categories alone has no numeric one).
    types = {"categorical": DataType.string, "text": DataType.string}
    types["datetime"] = DataType.datetime
    schema = Schema(
        [ColSpec(types.get(spec.column_roles.get(c), DataType.double), c) for c in columns]
    )
    inputs = []
    for split in splits:
        dataset = MetaDataset(
            source=resolve_dataset_source(redact(manifest.split_uris[split])),
            name=dataset_name(manifest, split),
            digest=manifest.fingerprint,
            schema=schema,
        )
        tags = [
            InputTag(key="mlflow.data.context", value=split),
            InputTag(key="trainflow.rows", value=str(manifest.rows[split])),
        ]
        inputs.append(DatasetInput(dataset=dataset._to_mlflow_entity(), tags=tags))
    tracker.client.log_inputs(run_id, datasets=inputs)


def version_tags(
    config, manifest: Manifest, source_run: str, pipeline_run: str, run_id: str | None
) -> dict[str, Any]:
    """The tags of a new model version: where its data, config, code and run came from."""
    tags = {
        "source_run": source_run,
        "pipeline_run": pipeline_run,
        "data_fingerprint": manifest.fingerprint,
        "config_hash": config_hash(config),
    }
    if run_id:
        tags["trainflow.run_id"] = run_id
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
    return tags
