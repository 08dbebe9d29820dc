"""Bring your LightningModule: `trainflow run` with ``train.engine: lightning``, an unchanged
module (``training_step``, ``validation_step``, ``configure_optimizers``, ``self.log``) from a
package outside the project on PYTHONPATH, trained by a Lightning Trainer that Ray's
integration prepares on each worker.

One run, smaller than the smoke run: a sweep of 4 trials (ASHA, max_t 2) where ASHA stops at
least one on what the module logged, a final training on 2 workers (RayDDPStrategy) where rank 1
crashes once and the Trainer resumes from Ray's latest checkpoint, evaluate, gate, registry; the
champion answers on the raw table where neither trainflow nor the user package is importable
(Lightning is: the model rebuilds the module)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from champion_checks import load_without_user_code, raw_test_rows
from cli_runner import run_cli, run_log_of

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pytest.importorskip("lightning.pytorch", reason="the [lightning] extra (make test has it)")

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
PACKAGE = "tf_e2e_user_lightning"
# A LightningModule as Lightning's own guides write it; `build` is the factory trainflow calls.
# Only for the test: the final training ("train") crashes once on rank 1 as epoch 2 begins, and
# the resumed Trainer writes down the epoch it resumed at. MARKERS is filled in by the fixture.
MODULE = """
import math
import os

import lightning.pytorch as pl
import torch
from torch import nn

MARKERS = "{markers}"


class Classifier(pl.LightningModule):
    def __init__(self, num_features, num_classes, width=32, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(num_features, width), nn.ReLU(),
                                 nn.Linear(width, num_classes))

    def forward(self, x):
        return self.net(x)

    def on_train_epoch_start(self):
        import ray.train  # here: the served model imports this module, and needs no Ray

        context = ray.train.get_context()
        if context.get_experiment_name() != "train" or context.get_world_rank() != 1:
            return
        crashed = os.path.join(MARKERS, "crashed")
        if self.current_epoch == 1 and not os.path.exists(crashed):
            open(crashed, "w").close()
            raise RuntimeError("injected crash of rank 1")
        if os.path.exists(crashed):
            open(os.path.join(MARKERS, f"resumed-at-epoch-{{self.current_epoch + 1}}"), "w").close()

    def training_step(self, batch, batch_idx):
        features, label = batch
        loss = nn.functional.cross_entropy(self(features), label)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        features, label = batch
        accuracy = (self(features).argmax(1) == label).float().mean()
        self.log("val_accuracy", accuracy, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def build(spec, width=32, lr=1e-2):
    return Classifier(math.prod(spec.input_shape), spec.num_outputs, width, lr)
"""
SETTINGS = {
    "model": {"kind": "custom", "factory": f"{PACKAGE}.module:build", "params": {"width": 32}},
    "train": {"engine": "lightning", "max_epochs": 2, "max_failures": 1},
    "sweep": {
        "asha": {"max_t": 2, "grace_period": 1, "reduction_factor": 2},
        # Trials of clearly different quality, so ASHA stops at least one at the first rung.
        "search_space": {"model.params.lr": {"loguniform": [1.0e-4, 3.0e-2]}},
    },
    "mlflow": {"experiment": "lightning-e2e", "registered_model": "digits-lightning"},
}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The trainflow home, and beside it the user's package (outside the project) and the
    directory the injected crash leaves its markers in."""
    home = tmp_path_factory.mktemp("lightning-home")
    markers = home / "markers"
    markers.mkdir()
    package = home / "user_code" / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "module.py").write_text(textwrap.dedent(MODULE.format(markers=markers)))
    return home


@pytest.fixture(scope="module")
def lightning_run(home):
    """configs/smoke.yaml with the user's LightningModule: the user's config file, one run."""
    raw = yaml.safe_load(SMOKE.read_text())
    for section, values in SETTINGS.items():
        raw.setdefault(section, {}).update(values)
    config = home / "lightning.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = home / "summary.json"
    path = os.pathsep.join(filter(None, [str(home / "user_code"), os.environ.get("PYTHONPATH")]))
    proc = run_cli(
        home, "run", "--config", str(config), "--summary-json", str(out), PYTHONPATH=path
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


@pytest.fixture(scope="module")
def client(home, lightning_run):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


def _metric_steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_asha_stops_trials_on_what_the_module_logged(lightning_run, client):
    summary, _ = lightning_run
    fates = [trial["status"] for trial in summary["sweep"]["trials"]]
    assert len(fates) == 4 and "errored" not in fates, fates
    assert fates.count("stopped-early") >= 1, fates
    experiment = client.get_run(summary["mlflow"]["parent_run_id"]).info.experiment_id
    runs = client.search_runs([experiment], max_results=100)
    trials = [r for r in runs if r.data.tags.get("trainflow.stage") == "trial"]
    assert len(trials) == 4
    for trial in trials:  # self.log's metrics, once per epoch the trial ran, numbered from 1
        assert _metric_steps(client, trial.info.run_id, "val_accuracy") in ([1], [1, 2])


def test_the_crashed_worker_resumed_from_the_checkpoint_each_epoch_logged_once(
    home, lightning_run, client
):
    summary, proc = lightning_run
    markers = sorted(p.name for p in (home / "markers").iterdir())
    assert markers == ["crashed", "resumed-at-epoch-2"], markers
    events = run_log_of(proc).read_text()  # every progress event; the console prints a few
    assert "starting 2 worker(s)" in events
    assert "worker(s) 1 failed; Ray Train restarts the group" in events
    train_run = summary["mlflow"]["train_run_id"]
    for key in ("val_accuracy", "train_loss"):
        assert _metric_steps(client, train_run, key) == [1, 2], key


def test_the_champion_answers_on_the_raw_table_without_trainflow_or_the_user_code(
    home, lightning_run, client
):
    summary, _ = lightning_run
    assert summary["model"]["decision"] == "first-model"
    assert summary["test_metrics"]["test_accuracy"] > 0.7, summary["test_metrics"]
    rows = raw_test_rows(home / "datasets" / "digits" / "digits.parquet")
    where = home / "alone"
    where.mkdir()
    rows.drop(columns=["label"]).to_parquet(where / "test.parquet")
    version = client.get_model_version_by_alias("digits-lightning", "champion")
    out = load_without_user_code(
        PACKAGE,
        f"sqlite:///{home / 'mlflow.db'}",
        "models:/digits-lightning@champion",
        where / "test.parquet",
        where / "preds.parquet",
    )
    assert out["rows"] == len(rows)
    assert out["user_code"] and f"code/{PACKAGE}/__init__.py" in out["user_code"], out
    preds = pd.read_parquet(where / "preds.parquet")
    accuracy = float((preds["prediction"].to_numpy() == rows["label"].to_numpy()).mean())
    assert accuracy == pytest.approx(float(version.tags["test_accuracy"]), abs=1e-6)
