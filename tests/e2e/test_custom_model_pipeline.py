"""Bring your own model: `trainflow run` with a factory from a user package that sits
in the directory the user runs from (importable neither from the project nor installed), a swept
``model.params`` key, to a champion that loads where neither trainflow nor the user package is
importable. Also ResNet-18 on an image table at smoke size, and a bad factory refused before
anything starts. One run per model kind, shared by the module's checks."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from champion_checks import load_without_user_code
from cli_runner import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
IMAGES = str(REPO_ROOT / "configs" / "images.yaml")
PACKAGE = "tf_e2e_models"
FACTORY = f"{PACKAGE}.nets:build"
NETS = """
import math
from torch import nn

def build(spec, width=32, depth=1):
    assert spec.task == "classification", spec
    layers = [nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, spec.num_outputs))
"""
CUSTOM = {
    "model": {"kind": "custom", "factory": FACTORY, "params": {"width": 32, "depth": 2}},
    "train": {"max_epochs": 2},
    "sweep": {
        "num_samples": 2,
        "asha": {"max_t": 2, "grace_period": 1},
        "search_space": {
            "model.params.width": {"choice": [16, 48]},
            "train.lr": {"loguniform": [3.0e-3, 1.0e-2]},
        },
    },
    "mlflow": {"experiment": "custom-e2e", "registered_model": "digits-custom"},
}


def load_alone(tracking_uri: str, model_uri: str, table: Path, out: Path) -> dict:
    return load_without_user_code(PACKAGE, tracking_uri, model_uri, table, out)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("custom-home")
    package = home / "cwd" / PACKAGE  # the directory run_cli runs trainflow from
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(NETS))
    return home


@pytest.fixture(scope="module")
def custom_run(home):
    """configs/smoke.yaml with the custom model (the user's config file)."""
    raw = yaml.safe_load(Path(SMOKE).read_text())
    for section, values in CUSTOM.items():
        raw.setdefault(section, {}).update(values)
    config = home / "custom.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = home / "summary.json"
    proc = run_cli(home, "run", "--config", str(config), "--summary-json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def client(home, custom_run):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


def test_the_custom_model_trains_sweeps_its_params_and_is_champion(custom_run, client):
    assert custom_run["test_metrics"]["test_accuracy"] > 0.7, custom_run["test_metrics"]
    assert custom_run["model"]["decision"] == "first-model"
    parent = custom_run["mlflow"]["parent_run_id"]
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment], max_results=100)
    trials = [r for r in runs if r.data.tags.get("trainflow.stage") == "trial"]
    assert len(trials) == 2
    # the swept factory keyword is a param of every trial run, as train.lr is
    assert {r.data.params["model.params.width"] for r in trials} <= {"16", "48"}
    assert all("train.lr" in r.data.params for r in trials)
    train = client.get_run(custom_run["mlflow"]["train_run_id"]).data.params
    assert train["model.kind"] == "custom" and train["model.factory"] == FACTORY
    assert train["model.params.width"] in ("16", "48") and train["model.params.depth"] == "2"


def test_the_checkpoint_records_the_factory_and_its_params(custom_run):
    from training.loop.checkpoint import load_state

    state = load_state(custom_run["checkpoint"])
    assert state["model_config"]["factory"] == FACTORY
    assert state["model_config"]["params"]["depth"] == 2
    assert state["model_config"]["params"]["width"] in (16, 48)
    width = state["model_config"]["params"]["width"]
    assert state["model"]["net.1.weight"].shape == (width, 64)  # the user's module, under net.


def test_the_champion_carries_the_user_package_and_loads_without_it(home, custom_run, client):
    from champion_checks import champion_scores_digits_alone

    champion_scores_digits_alone(home, client, PACKAGE, "digits-custom")


def test_a_bad_factory_is_refused_before_anything_starts(tmp_path):
    """Exit 2, one message naming model.factory and the fix, no traceback, no Ray started."""
    home = tmp_path / "home"
    package = home / "cwd" / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text("def build(spec, width=8):\n    return 'not a module'\n")
    start = time.monotonic()
    proc = run_cli(
        home,
        "run",
        "--config",
        SMOKE,
        "--set",
        "model.kind=custom",
        "--set",
        f"model.factory={FACTORY}",
    )
    took = time.monotonic() - start
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert f"model.factory='{FACTORY}': it returned str, not a torch.nn.Module" in text, text
    assert "Traceback" not in text
    # checked before Prefect, MLflow or Ray start: none of them left anything in the home
    assert not [p for p in ("ray", "prefect", "mlflow.db", "storage") if (home / p).exists()]
    # ~9 s here unloaded (the issue asks under 20 s); the margin is for a machine under load
    assert took < 30, took


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """configs/images.yaml (ResNet-18) on a small parquet of image arrays at smoke size."""
    import numpy as np

    from training.data.builtin import digits

    home = tmp_path_factory.mktemp("images-home")
    pixels, labels = digits()
    table = home / "images.parquet"
    pd.DataFrame({"image": [p.reshape(1, 8, 8).ravel().tolist() for p in pixels[:300]]}).assign(
        label=labels[:300].astype(np.int64)
    ).to_parquet(table)
    out = home / "summary.json"
    sets = [
        f"data.source={table}",
        "data.image_shape=[1, 8, 8]",
        "sweep.enabled=false",
        "train.max_epochs=1",
        "train.batch_size=32",
    ]
    args = [a for s in sets for a in ("--set", s)]
    proc = run_cli(home, "run", "--config", IMAGES, *args, "--summary-json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return home, json.loads(out.read_text()), table


def test_resnet18_trains_on_an_image_table_and_its_champion_loads_alone(image_run):
    from training.loop.checkpoint import load_state

    home, summary, table = image_run
    assert summary["sweep"] is None
    assert 0.0 <= summary["test_metrics"]["test_accuracy"] <= 1.0
    state = load_state(summary["checkpoint"])
    assert state["model_config"]["kind"] == "resnet18"
    assert state["model"]["conv1.weight"].shape == (64, 1, 3, 3)  # small-image stem
    assert state["model"]["fc.weight"].shape == (10, 512)
    where = home / "alone"
    where.mkdir()
    pd.read_parquet(table).drop(columns=["label"]).head(20).to_parquet(where / "rows.parquet")
    out = load_alone(
        f"sqlite:///{home / 'mlflow.db'}",
        "models:/digits32-resnet18@champion",
        where / "rows.parquet",
        where / "preds.parquet",
    )
    assert out == {"rows": 20, "user_code": None}
