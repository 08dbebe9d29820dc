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
