"""Ray Data's share of a local instance's object store (training.platform.cluster)."""

from __future__ import annotations

import pytest

from training.platform import cluster


@pytest.fixture
def options():
    from ray.data import DataContext

    options = DataContext.get_current().execution_options
    before = options.resource_limits
    yield options
    options.resource_limits = before


def test_an_unbounded_store_is_bounded_and_the_ingest_starts_from_it(options):
    import ray.train

    options.resource_limits = options.resource_limits.copy(object_store_memory=float("inf"))
    cluster._bound_ray_data_object_store()
    assert options.resource_limits.object_store_memory == cluster.DATA_OBJECT_STORE_BYTES
    ingest = ray.train.DataConfig.default_ingest_options()
    assert ingest.resource_limits.object_store_memory == cluster.DATA_OBJECT_STORE_BYTES


def test_a_lower_limit_already_set_is_kept(options):
    options.resource_limits = options.resource_limits.copy(object_store_memory=64 * 1024**2)
    cluster._bound_ray_data_object_store()
    assert options.resource_limits.object_store_memory == 64 * 1024**2
