"""Promotions that race on `champion`, and a promote step re-run after a crash.

Real sqlite MLflow stores; the racers are separate processes, as two pipeline runs would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from model_states import raw_rows, trainflow_state

from training.config import MlflowConfig, PipelineConfig

REPO_ROOT = Path(__file__).resolve().parents[2]

# One racer: promote VERSION with VALUE once the GO file exists. Reading the
# champion is slowed down so that, without a lock, both racers would read "no champion" before
# either writes: the window a real race has, made wide enough to hit every time.
RACER = textwrap.dedent(
    """
    import json, sys, time
    from training.config import MlflowConfig, PipelineConfig
    from training.tracking import registry
    from training.tracking.store import configure

    import os
    uri, name, version, value, ready, go = sys.argv[1:7]
    tracker = configure(PipelineConfig(mlflow=MlflowConfig(
        tracking_uri=uri, experiment="race", registered_model=name)))
    read = tracker.client.get_model_version_by_alias

    def slow_read(*args, **kwargs):
        try:
            return read(*args, **kwargs)
        finally:
            time.sleep(1.0)

    tracker.client.get_model_version_by_alias = slow_read
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    print(json.dumps(registry.promote(tracker, version, float(value))))
    """
)


def _config(uri: str, name: str) -> PipelineConfig:
    return PipelineConfig(
        mlflow=MlflowConfig(tracking_uri=uri, experiment="race", registered_model=name)
    )


@pytest.fixture
def store(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _race(uri: str, name: str, entrants: list[tuple[str, float]], tmp: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    go = tmp / "go"
    ready = [tmp / f"ready-{i}" for i in range(len(entrants))]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, uri, name, version, str(value), str(flag), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for (version, value), flag in zip(entrants, ready, strict=True)
    ]
    deadline = time.monotonic() + 120
    while not all(flag.exists() for flag in ready) and time.monotonic() < deadline:
        dead = [proc for proc in procs if proc.poll() is not None]
        assert not dead, f"a racer died before the start: {dead[0].communicate()[1][-3000:]}"
        time.sleep(0.05)
    go.touch()  # both imported mlflow and connected: start together
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_racing_promotions_end_with_the_better_model_as_champion(store, tmp_path):
    from training.tracking.lock import LOCK_SUFFIX
    from training.tracking.store import configure

    name = "race-model"
    tracker = configure(_config(store, name))
    client = tracker.client
    client.create_registered_model(name)
    worse = client.create_model_version(name, "file:///nowhere/worse").version
    better = client.create_model_version(name, "file:///nowhere/better").version

    results = _race(store, name, [(str(worse), 0.90), (str(better), 0.95)], tmp_path)

    champion = client.get_model_version_by_alias(name, "champion")
    assert str(champion.version) == str(better), results
    decisions = sorted(r["decision"] for r in results)
    # One of them found no champion; the other compared against it, never against nothing.
    assert decisions in (["first-model", "promoted"], ["first-model", "kept-champion"]), results
    assert client.get_model_version(name, better).tags["gate.decision"] in (
        "first-model",
        "promoted",
    )
    # The lock is gone: the registry holds the model, not a leftover lock.
    names = {m.name for m in client.search_registered_models()}
    assert f"{name}{LOCK_SUFFIX}" not in names


def test_a_lock_left_by_a_crashed_promotion_is_broken_once_stale(store, monkeypatch):
    from training.errors import TrainflowError
    from training.tracking import lock, registry
    from training.tracking.store import configure

    name = "stale-model"
    tracker = configure(_config(store, name))
    tracker.client.create_registered_model(name)
    version = tracker.client.create_model_version(name, "file:///nowhere/v1").version
    # A promotion that crashed inside the lock left it behind.
    tracker.client.create_registered_model(f"{name}{lock.LOCK_SUFFIX}")

    with (
        pytest.raises(TrainflowError) as err,
        lock.registry_lock(tracker.client, name, timeout_s=1.0),
    ):
        pass
    assert f"{name}{lock.LOCK_SUFFIX}" in str(err.value)
    assert "delete the registered model" in str(err.value)

    monkeypatch.setattr(lock, "LOCK_STALE_S", 0.0)
    assert registry.promote(tracker, str(version), 0.9)["decision"] == "first-model"


def test_promote_step_rerun_after_a_crash_registers_no_duplicate(store, tmp_path, monkeypatch):
    """A crash between logging the model and registering it, then one after registering it:
    each re-run of the step ends with one version of the run's model, champion on it."""
    import mlflow
    import torch

    from training.tracking import flavour, registry
    from training.tracking.store import configure

    name = "rerun-model"
    tracker = configure(_config(store, name))
    parent = tracker.start_parent_run("rerun")
    run = tracker.start_child_run(parent, "train", "train")
    state = tmp_path / "state.pt"
    torch.save(trainflow_state(), state)

    def step():
        info = flavour.log_model(tracker, run, str(state), raw_rows(3), "m")
        return info, registry.promote(tracker, info.version, 0.9)

    register = mlflow.register_model

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed between log_model and register_model")

    monkeypatch.setattr(mlflow, "register_model", crash)
    with pytest.raises(KeyboardInterrupt):
        step()
    monkeypatch.setattr(mlflow, "register_model", register)
    info, decision = step()  # the re-run after the crash
    again, decision_again = step()  # and once more, as if it crashed after promoting

    versions = tracker.client.search_model_versions(f"name = '{name}'")
    assert [str(v.version) for v in versions] == [info.version]
    assert again == info
    assert decision["decision"] == decision_again["decision"] == "first-model"
    champion = tracker.client.get_model_version_by_alias(name, "champion")
    assert str(champion.version) == info.version
