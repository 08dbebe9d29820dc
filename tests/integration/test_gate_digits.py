"""The gate on real data (digits): a champion whose stored score misleads, both ways; and
new training data that drifted from the champion's (three pixels brightened) kept out by
``mlflow.gate.max_drift``, or promoted with a warning.

The champion's stored value was measured on its own test rows; here it says 0.999 (easier rows)
or 0.5 (harder rows). The promote stage scores the champion on the challenger's test rows
through the registered pyfunc and decides on the same rows, with the interval: the better
model wins either way, where the stored-value comparison picks the worse one.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest

from training.gate import policy as gate

pytestmark = pytest.mark.integration
NAME = "gate-digits"


def _state(manifest, steps: int, seed: int) -> dict:
    """An MLP trained full-batch for ``steps`` Adam steps on the train split's raw rows,
    through the one transform (few steps: a weak model; many: a strong one)."""
    import torch

    from training.config import ModelConfig
    from training.data.splits import raw_split_here
    from training.model.networks import build_model
    from training.model.trainflow_pyfunc.transform import transform

    spec = manifest.spec
    frame = pd.concat(list(raw_split_here(manifest, "train")), ignore_index=True)
    data = transform(frame, spec.to_dict(), with_labels=True)
    x, y = torch.as_tensor(data["features"]), torch.as_tensor(data["label"]).long()
    torch.manual_seed(seed)
    config = ModelConfig(hidden_sizes=[32], dropout=0.0)
    net = build_model(config, spec.input_shape, spec.num_outputs, spec.task)
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(steps):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimiser.step()
    net.eval()
    return {"model": net.state_dict(), "spec": spec.to_dict(), "model_config": config.model_dump()}


def _evaluated(manifest, state):
    """What the evaluate stage hands promote: metrics, state, and the test rows it scored."""
    from training.data.splits import raw_split_here
    from training.inference.evaluate import evaluate_state
    from training.stages.evaluated import Evaluated

    result, scored = evaluate_state(state, manifest, "test")
    rows = pd.concat(list(raw_split_here(manifest, "test")), ignore_index=True)
    return Evaluated(result, state, rows.head(5), rows, scored.labels, scored.predictions)


@pytest.fixture(scope="module")
def models(manifest):
    weak, strong = _state(manifest, 4, seed=1), _state(manifest, 150, seed=2)
    return {"weak": _evaluated(manifest, weak), "strong": _evaluated(manifest, strong)}


def _champion_with_stored_value(config, evaluated, stored: float, tmp_path) -> str:
    """Register ``evaluated``'s model as champion, its stored score ``stored``."""
    from training.loop.checkpoint import save_state
    from training.tracking import flavour, registry
    from training.tracking.store import configure

    tracker = configure(config)
    parent = tracker.start_parent_run("champion-run")
    run = tracker.start_child_run(parent, "train", stage="train")
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = save_state(evaluated.state, str(tmp_path))
    version = flavour.log_model(tracker, run, path, evaluated.example, description="champion")
    assert registry.promote(tracker, version.version, stored)["decision"] == "first-model"
    return version.version


def _promote_challenger(config, manifest, evaluated):
    from training.stages.promote import promote
    from training.stages.train import Trained
    from training.tracking.store import configure

    tracker = configure(config)
    parent = tracker.start_parent_run("challenger-run")
    run = tracker.start_child_run(parent, "train", stage="train")
    started = time.monotonic()
    summary = promote(config, manifest, Trained(None, run), evaluated, parent)
    return summary, time.monotonic() - started, tracker


def _config(tmp_path):
    from training.config.overrides import load_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return load_config(None, [f"mlflow.tracking_uri={uri}", f"mlflow.registered_model={NAME}"])


@pytest.mark.parametrize(
    ("champion", "stored", "challenger", "verdict"),
    [
        ("weak", 0.999, "strong", gate.PROMOTED),  # champion's easier rows flattered it
        ("strong", 0.5, "weak", gate.KEPT_CHAMPION),  # champion's harder rows undersold it
    ],
)
def test_the_better_model_wins_on_the_same_rows(
    manifest, models, tmp_path, champion, stored, challenger, verdict
):
    config = _config(tmp_path)
    held = _champion_with_stored_value(config, models[champion], stored, tmp_path / "champion")
    new = models[challenger]
    value = new.result.metrics["test_accuracy"]
    stored_decision = gate.decide(
        "test_accuracy",
        0.0,
        "2",
        value,
        gate.Champion(held, {gate.METRIC_TAG: "test_accuracy", gate.VALUE_TAG: repr(stored)}),
    )
    assert stored_decision.decision != verdict  # the stored value alone would pick wrong

    summary, seconds, tracker = _promote_challenger(config, manifest, new)

    assert summary.decision == verdict, summary.gate_record
    record = summary.gate_record
    rows = len(new.test_rows)
    assert record["rows"] == rows and record["champion_version"] == held
    # both scores on the same rows: the champion's is its real one here, not the stored value
    real = models[champion].result.metrics["test_accuracy"]
    assert record["champion"] == pytest.approx(real)
    assert record["challenger"] == pytest.approx(value)
    low, high = record["interval"]
    assert (low > 0) if verdict == gate.PROMOTED else (high < 0)
    version = tracker.client.get_model_version(NAME, summary.version)
    assert f"on the same {rows} rows" in version.description
    assert "at 95%" in version.description
    assert version.tags[gate.DECISION_TAG] == verdict
    print(f"promote stage with the champion scored on {rows} rows: {seconds:.2f} s")


SHIFTED = ["pixel_20", "pixel_21", "pixel_43"]


@pytest.fixture(scope="module")
def shifted(ray_local, layout, tmp_path_factory):
    """The digits with three pixels brightened by 6 (of 0..16): new data that drifted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.config.overrides import load_config
    from training.data.builtin import digits
    from training.data.inputs import fingerprint, resolve_inputs
    from training.data.preprocess import preprocess

    pixels, labels = digits()
    frame = pd.DataFrame({f"pixel_{i:02d}": pixels[:, i] for i in range(pixels.shape[1])})
    for column in SHIFTED:
        frame[column] = frame[column] + 6.0
    frame["label"] = labels
    path = tmp_path_factory.mktemp("shifted") / "digits-shifted.parquet"
    pq.write_table(pa.Table.from_pandas(frame), path)
    config = load_config(None, [f"data.source={path}"])
    files = resolve_inputs(config.data)
    return preprocess(config, layout, fingerprint(config.data, files), files)


@pytest.mark.parametrize(("on_drift", "verdict"), [("block", gate.KEPT_CHAMPION), ("warn", None)])
def test_a_shifted_table_is_blocked_by_max_drift(
    manifest, shifted, models, tmp_path, on_drift, verdict
):
    from training.stages.drift_check import DRIFT_TABLE, measure
    from training.stages.promote import promote
    from training.stages.train import Trained
    from training.tracking.store import configure

    config = _config(tmp_path).with_overrides(
        {"mlflow.gate.max_drift": 0.2, "mlflow.gate.on_drift": on_drift}
    )
    _champion_with_stored_value(config, models["weak"], 0.5, tmp_path / "champion")
    tracker = configure(config)

    same = measure(config, tracker, tracker.start_parent_run("same-data"), manifest)
    assert same is not None and same.columns[0].psi < 0.05  # the champion's own data

    parent = tracker.start_parent_run("shifted-data")
    started = time.monotonic()
    report = measure(config, tracker, parent, shifted)
    print(f"drift against the champion measured in {time.monotonic() - started:.2f} s")
    drifted = [d.column for d in report.over(0.2)]
    assert set(drifted) == set(SHIFTED), report.columns[:5]
    run = tracker.client.get_run(parent)
    assert run.data.metrics["drift_psi.pixel_20"] > 0.2
    assert run.data.metrics["drift_psi.pixel_00"] < 0.2
    logged = tracker.client.list_artifacts(parent)
    assert DRIFT_TABLE in [a.path for a in logged]

    # the challenger, trained on the new data, beats the weak champion on the same rows
    challenger = _evaluated(shifted, _state(shifted, 150, seed=2))
    run_id = tracker.start_child_run(parent, "train", stage="train")
    summary = promote(
        config, shifted, Trained(None, run_id), challenger, parent, drift=report.to_dict()
    )
    record = summary.gate_record
    assert summary.decision == (verdict or gate.PROMOTED), record
    assert "'pixel_2" in record["reason"] and "PSI" in record["reason"]
    assert {d["column"] for d in record["drift"]} == set(SHIFTED)
    if on_drift == "block":
        assert "max_drift 0.2" in record["reason"] and "on_drift=block" in record["reason"]
    else:
        assert "promoted anyway" in record["reason"]
