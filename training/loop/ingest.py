"""How the splits reach the training workers: in the object store when small, streamed from
storage otherwise, or handed to the loop as arrays."""

from __future__ import annotations

from typing import Any

from training.config import PipelineConfig
from training.manifest import Manifest
from training.platform import cluster

# Splits smaller than this are kept in the object store across epochs: re-reading parquet every
# epoch costs seconds per epoch on small data; larger splits stream from storage as usual.
MATERIALIZE_BELOW_BYTES = 256 * 1024**2


def training_datasets(
    manifest: Manifest, endpoint_url: str | None = None, materialize: bool = True
) -> dict:
    """The train/val Ray Datasets, put in the object store when small and ``materialize``."""
    from training.data.read import read_split, split_in_object_store

    datasets = {}
    for split in ("train", "val"):
        size = manifest.rows[split] * manifest.spec.num_features * 4
        if materialize and size < MATERIALIZE_BELOW_BYTES:
            datasets[split] = split_in_object_store(manifest, split, endpoint_url)
        else:
            datasets[split] = read_split(manifest, split, endpoint_url)
    return datasets


def ingest_options():
    """Ray Data's execution options for the training workers' shards. preserve_order makes the
    split across workers and each shard's order a function of the data alone (by default Ray
    Data yields blocks as their tasks finish), so a mid-epoch resume can skip exactly the
    batches it already trained on."""
    import ray.train

    options = ray.train.DataConfig.default_ingest_options()
    options.preserve_order = True
    return options


def in_memory_splits(
    config: PipelineConfig, manifest: Manifest, fewest_workers: int
) -> dict[str, Any] | None:
    """Object refs of the train/val arrays when both are small, on one node, and each
    worker's shard fits ``train.shard_cache_mb``; None means Ray Data streams the shards.

    Small data is what workers would cache after one Ray Data pass anyway; handing them the
    arrays skips the split's three extra processes (dataset manager, two split coordinators).
    """
    import ray

    from training.data.read import load_split_arrays

    if config.train.engine != "loop":
        return None  # a Trainer or a user's function reads Ray Data shards, as the guides do
    row_bytes = manifest.spec.row_bytes
    cache_bytes = config.train.shard_cache_mb * 1024**2
    for split in ("train", "val"):
        size = manifest.rows[split] * row_bytes
        if size >= MATERIALIZE_BELOW_BYTES or size / fewest_workers > cache_bytes:
            return None
    if not cluster.is_single_node():
        return None  # refs owned by this driver; streaming from storage survives node loss
    endpoint = config.storage.endpoint_url
    return {
        split: ray.put(load_split_arrays(manifest, split, endpoint)) for split in ("train", "val")
    }
