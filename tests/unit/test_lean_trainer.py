"""The TorchTrainer we build leaves out Ray Train's dataset manager when it has no datasets, and
its placement-group cleaner only where the fit's driver owns the local instance (two
processes fewer per fit). A Tune trial's fit, or one on a cluster, keeps the cleaner."""

from __future__ import annotations

import pytest
import ray
import ray.train

import training.platform.cluster as cluster
from training.loop.trainer import _lean_torch_trainer


class _Context:
    def __init__(self, actor_id):
        self._actor_id = actor_id

    def get_actor_id(self):
        return self._actor_id


def _callbacks(monkeypatch, *, local: bool, actor_id=None, datasets=None) -> set[str]:
    monkeypatch.setattr(cluster, "started_local_instance", lambda: local)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: _Context(actor_id))
    trainer = _lean_torch_trainer()(
        lambda config: None, scaling_config=ray.train.ScalingConfig(num_workers=2)
    )
    trainer.datasets = datasets or {}
    return {type(callback).__name__ for callback in trainer._create_default_callbacks()}


@pytest.mark.parametrize(
    ("local", "actor_id", "cleaner_kept"),
    [(True, None, False), (False, None, True), (True, "a-tune-trial", True)],
    ids=["driver-of-local-instance", "cluster", "tune-trial"],
)
def test_the_cleaner_stays_where_ray_outlives_the_fit(monkeypatch, local, actor_id, cleaner_kept):
    names = _callbacks(monkeypatch, local=local, actor_id=actor_id)
    assert ("PlacementGroupCleanerCallback" in names) is cleaner_kept
    # What the fit needs is always there.
    assert {"BackendSetupCallback", "UserCallbackHandler"} <= names


def test_the_dataset_manager_comes_only_with_datasets(monkeypatch):
    assert "DatasetsCallback" not in _callbacks(monkeypatch, local=False)
    with_data = _callbacks(monkeypatch, local=False, datasets={"train": object()})
    assert "DatasetsCallback" in with_data
