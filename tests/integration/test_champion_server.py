"""History and rollback against a real `mlflow server`, and a rollback racing a promotion: both
take the promotion lock, so the champion's history stays one unbroken chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NAME = "served-model"

# One racer: a promotion (VERSION, VALUE) or a rollback, once the GO file exists. Reading the
# champion is slowed down, so that without the lock both would read the same champion.
RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from training.config import MlflowConfig, PipelineConfig
    from training.tracking import champion_history, registry
    from training.tracking.store import configure

    uri, name, what, version, value, ready, go = sys.argv[1:8]
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
    if what == "promote":
        out = registry.promote(tracker, version, float(value))
        out.pop("record")
    else:
        out = champion_history.rollback(tracker.client, name, why="racing")
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a free loopback port (sqlite + local artifacts)."""
    from mlflow_servers import mlflow_server

    home = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server(home, home / "server.log", artifacts=home / "artifacts") as url:
        yield url


def _race(uri: str, entrants: list[tuple[str, str, str]], tmp: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    go = tmp / "go"
    ready = [tmp / f"ready-{i}" for i in range(len(entrants))]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, uri, NAME, what, version, value, str(flag), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for (what, version, value), flag in zip(entrants, ready, strict=True)
    ]
    deadline = time.monotonic() + 120
    while not all(flag.exists() for flag in ready) and time.monotonic() < deadline:
        dead = [proc for proc in procs if proc.poll() is not None]
        assert not dead, f"a racer died before the start: {dead[0].communicate()[1][-3000:]}"
        time.sleep(0.05)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_history_and_rollback_on_a_server_and_a_rollback_racing_a_promotion(server, tmp_path):
    from training.config import MlflowConfig, PipelineConfig
    from training.tracking import registry
    from training.tracking.champion_history import history, rollback
    from training.tracking.store import configure

    config = PipelineConfig(mlflow=MlflowConfig(tracking_uri=server, registered_model=NAME))
    tracker = configure(config)
    client = tracker.client
    client.create_registered_model(NAME)
    versions = [
        str(client.create_model_version(NAME, f"s3://nowhere/m/{i}").version) for i in range(3)
    ]
    assert registry.promote(tracker, versions[0], 0.80)["decision"] == "first-model"
    assert registry.promote(tracker, versions[1], 0.90)["decision"] == "promoted"
    back = rollback(client, NAME, why="check")
    assert (back["from"], back["to"]) == (versions[1], versions[0])
    forward = rollback(client, NAME, to=versions[1])
    assert forward["to"] == versions[1]

    results = _race(server, [("promote", versions[2], "0.95"), ("rollback", "", "")], tmp_path)

    moves = history(client, NAME)
    assert len(moves) == 6, moves  # 2 promotions, 2 rollbacks, then both racers' moves
    for before, after in zip(moves, moves[1:], strict=False):
        assert after["from"] == before["to"], moves  # one chain: no move from a stale champion
    champion = client.get_model_version_by_alias(NAME, "champion")
    assert str(champion.version) == moves[-1]["to"], (moves, results)
    assert {m["kind"] for m in moves[-2:]} == {"promote", "rollback"}
    names = {m.name for m in client.search_registered_models()}
    assert f"{NAME}.champion-lock" not in names
