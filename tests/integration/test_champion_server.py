"""History and rollback against a real `mlflow server`, and a rollback racing a promotion: both
take the promotion lock, so the champion's history stays one unbroken chain."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a free loopback port (sqlite + local artifacts)."""
    home = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (home / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
        + ["--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}"]
        + ["--artifacts-destination", str(home / "artifacts"), "--workers", "1"],
        cwd=home,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("mlflow server did not start:\n" + (home / "server.log").read_text())
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()


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
