"""Scheduled scoring's stage (training/stages/score.py), in process: the champion of a real
registry scores a table through Ray Data and the pyfunc; the predictions land beside the input
with the version that made them, the rows and seconds on an MLflow run; no champion is an error
that says what to do."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from training.errors import ModelNotFoundError

pytestmark = pytest.mark.integration
NAME = "score-digits"


def _config(tmp_path):
    from training.config.overrides import load_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return load_config(None, [f"mlflow.tracking_uri={uri}", f"mlflow.registered_model={NAME}"])


def _register_champion(config, manifest, tmp_path) -> str:
    """An untrained MLP on the digits spec, registered and made champion (scores are not the
    point here: where they go and what they say is)."""
    import torch

    from training.config import ModelConfig
    from training.loop.checkpoint import save_state
    from training.model.networks import build_model
    from training.tracking import flavour, registry
    from training.tracking.store import configure

    spec = manifest.spec
    torch.manual_seed(0)
    model_config = ModelConfig(hidden_sizes=[8], dropout=0.0)
    net = build_model(model_config, spec.input_shape, spec.num_outputs, spec.task)
    state = {
        "model": net.state_dict(),
        "spec": spec.to_dict(),
        "model_config": model_config.model_dump(),
    }
    tracker = configure(config)
    parent = tracker.start_parent_run("champion-run")
    run = tracker.start_child_run(parent, "train", stage="train")
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = save_state(state, str(tmp_path))
    version = flavour.log_model(tracker, run, path, None, description="champion")
    registry.promote(tracker, version.version, 0.5)
    return version.version


def test_the_champion_scores_a_table_beside_it(manifest, tmp_path):
    from training.data.builtin import digits
    from training.stages.score import VERSION_COLUMN, score
    from training.tracking.store import configure

    config = _config(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no champion"):
        score(config, "builtin:digits", "r0")
    version = _register_champion(config, manifest, tmp_path / "state")
    pixels, _ = digits()
    table = pd.DataFrame({f"pixel_{i:02d}": pixels[:300, i] for i in range(64)})
    source = tmp_path / "incoming" / "new.parquet"
    source.parent.mkdir()
    table.to_parquet(source)

    scored = score(config, str(source), "r1")

    assert scored.output == str(tmp_path / "incoming" / f"new.scored-v{version}.parquet")
    assert scored.rows == 300 and scored.version == version
    out = pq.read_table(scored.output).to_pandas()
    assert len(out) == 300 and set(out[VERSION_COLUMN]) == {version}
    assert "prediction" in out and "pixel_00" in out
    run = configure(config).client.get_run(scored.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["rows"] == 300 and run.data.metrics["seconds"] > 0
    assert run.data.params["output"] == scored.output
    assert run.data.tags["trainflow.model_version"] == version


# Credentials of the loopback S3 (moto accepts any): canaries that no log, parameter, tag or
# artifact of the scoring may hold.
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIASCORECANARY7Q2",
    "AWS_SECRET_ACCESS_KEY": "score-canary-secret-3f9d",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUCKET = "trainflow-score"
# A fresh process (Ray's workers inherit the credentials from the environment Ray starts in;
# this session's Ray started without them), told the endpoint only through storage.endpoint_url.
SCORE_SCRIPT = """
import json, sys
from training.config.overrides import load_config
from training.platform import cluster
from training.stages.score import score

config = load_config(None, json.loads(sys.argv[1]))
try:
    print("SCORED " + json.dumps(score(config, sys.argv[2], "s3run").to_dict()))
finally:
    cluster.shutdown()
"""


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """``moto_server`` on a free loopback port with one bucket; its endpoint."""
    from loopback_s3 import moto_server

    with moto_server(tmp_path_factory.mktemp("moto"), BUCKET, S3_CREDENTIALS) as endpoint:
        yield endpoint


def test_the_champion_scores_an_s3_table_beside_it_without_leaking_credentials(
    manifest, tmp_path, s3_endpoint, monkeypatch
):
    """Scheduled scoring on ``s3://``: read and written through storage.endpoint_url and the
    environment's credentials, as every other stage reaches S3."""
    import json
    import os
    import subprocess
    import sys

    from training.data.builtin import digits
    from training.stages.score import VERSION_COLUMN
    from training.storage import filesystem
    from training.tracking.store import configure

    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [
        f"mlflow.tracking_uri={uri}",
        f"mlflow.registered_model={NAME}",
        f"storage.endpoint_url={s3_endpoint}",
    ]
    from training.config.overrides import load_config

    config = load_config(None, overrides)
    version = _register_champion(config, manifest, tmp_path / "state")
    pixels, _ = digits()
    table = pd.DataFrame({f"pixel_{i:02d}": pixels[:250, i] for i in range(64)})
    source = f"s3://{BUCKET}/incoming/new.parquet"
    fs, path = filesystem(source, s3_endpoint)
    with fs.open_output_stream(path) as out:
        table.to_parquet(out)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", SCORE_SCRIPT, json.dumps(overrides), source],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SCORED "))
    scored = json.loads(line.removeprefix("SCORED "))

    assert scored["output"] == f"s3://{BUCKET}/incoming/new.scored-v{version}.parquet"
    assert scored["rows"] == 250 and scored["version"] == version
    fs, path = filesystem(scored["output"], s3_endpoint)
    with fs.open_input_file(path) as handle:
        out = pq.read_table(handle).to_pandas()
    assert len(out) == 250 and set(out[VERSION_COLUMN]) == {version}
    assert "prediction" in out and "pixel_00" in out

    run = configure(config).client.get_run(scored["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["rows"] == 250
    assert run.data.params["source"] == source
    assert run.data.params["output"] == scored["output"]
    secrets = [S3_CREDENTIALS["AWS_ACCESS_KEY_ID"], S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]]
    said = proc.stdout + proc.stderr + json.dumps([run.data.params, run.data.tags])
    assert [s for s in secrets if s in said] == []
    stored = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [str(p) for p in stored for s in secrets if s.encode() in p.read_bytes()] == []
