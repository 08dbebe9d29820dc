"""Fixtures shared by the integration tests that train on the preprocessed digits."""

from __future__ import annotations

import pytest

from training.data.inputs import fingerprint, resolve_inputs
from training.data.preprocess import preprocess
from training.overrides import load_config
from training.storage import StorageLayout


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> StorageLayout:
    """A storage root of the test module's own (runs of one module never meet another's)."""
    return StorageLayout(root=str(tmp_path_factory.mktemp("storage")))


@pytest.fixture(scope="module")
def manifest(ray_local, layout):
    """The default data, preprocessed once per module into ``layout``."""
    config = load_config(None)
    files = resolve_inputs(config.data)
    return preprocess(config, layout, fingerprint(config.data, files), files)
