"""Bring your own loop: `trainflow run` with ``train.engine: function``, a ``train_func`` written
as the Ray Train guides write it (``prepare_model``, ``get_dataset_shard(...)
.iter_torch_batches``, ``ray.train.report(metrics, checkpoint=...)``,
``ray.train.get_checkpoint()``), from a package outside the project on PYTHONPATH.

One run at smoke size: a sweep of 4 trials where ASHA stops at least one on the function's
reports, a final training on 2 workers where the function crashes once on rank 1 and resumes
from its own checkpoint, evaluate, gate, registry; the champion answers on the raw table where
neither trainflow nor the user package is importable."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml
from champion_checks import champion_scores_digits_alone
from cli_runner import run_cli, run_log_of

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = REPO_ROOT / "configs" / "smoke.yaml"
PACKAGE = "tf_e2e_user_loop"
NETS = """
import math
from torch import nn

def build(spec, width=32):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width),
                         nn.ReLU(), nn.Linear(width, spec.num_outputs))
"""
# The guides' loop. The final training ("train") crashes once on rank 1 as epoch 2 begins; a
# resumed attempt writes down the epoch it resumed from. MARKERS is filled in by the fixture.
LOOP = """
import os, tempfile
from types import SimpleNamespace

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from PACKAGE.nets import build

MARKERS = "{markers}"


def train_func(config):
    torch.manual_seed(config["seed"])
    model = build(SimpleNamespace(**config["spec"]), **config["params"])
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"],
                                  weight_decay=config["weight_decay"])
    context = ray.train.get_context()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "extra.pt"), weights_only=True)
            weights = torch.load(os.path.join(directory, "model.pt"), weights_only=True)
        getattr(model, "module", model).load_state_dict(weights)
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["epoch"]) + 1
        if context.get_world_rank() == 0:
            open(os.path.join(MARKERS, f"resumed-at-epoch-{{start + 1}}"), "w").close()
    final = context.get_experiment_name() == "train"
    per_worker = max(1, config["batch_size"] // context.get_world_size())
    for epoch in range(start, config["max_epochs"]):
        crashed = os.path.join(MARKERS, "crashed")
        if final and epoch == 1 and context.get_world_rank() == 1 and not os.path.exists(crashed):
            open(crashed, "w").close()
            raise RuntimeError("injected crash of rank 1")
        model.train()
        for batch in ray.train.get_dataset_shard("train").iter_torch_batches(
            batch_size=per_worker
        ):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
            loss.backward()
            optimizer.step()
        model.eval()
        sums = torch.zeros(2)
        with torch.no_grad():
            for batch in ray.train.get_dataset_shard("val").iter_torch_batches(batch_size=256):
                hits = (model(batch["features"]).argmax(1) == batch["label"]).sum().item()
                sums += torch.tensor([hits, len(batch["label"])])
        if dist.is_initialized():
            dist.all_reduce(sums)
        metrics = {{"train_loss": loss.item(), "val_accuracy": (sums[0] / sums[1]).item()}}
        with tempfile.TemporaryDirectory() as directory:
            saved = None
            if context.get_world_rank() == 0:
                module = getattr(model, "module", model)
                torch.save(module.state_dict(), os.path.join(directory, "model.pt"))
                extra = {{"optimizer": optimizer.state_dict(), "epoch": epoch}}
                torch.save(extra, os.path.join(directory, "extra.pt"))
                saved = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=saved)
"""
SETTINGS = {
    "model": {"kind": "custom", "factory": f"{PACKAGE}.nets:build", "params": {"width": 32}},
    "train": {"engine": "function", "function": f"{PACKAGE}.loop:train_func", "max_failures": 1},
    "mlflow": {"experiment": "function-e2e", "registered_model": "digits-function"},
}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The trainflow home, and beside it the user's package (outside the project) and the
    directory the injected crash leaves its markers in."""
    home = tmp_path_factory.mktemp("function-home")
    markers = home / "markers"
    markers.mkdir()
    package = home / "user_code" / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(NETS))
    loop = LOOP.replace("PACKAGE", PACKAGE).format(markers=markers)
    (package / "loop.py").write_text(textwrap.dedent(loop))
    return home


@pytest.fixture(scope="module")
def function_run(home):
    """configs/smoke.yaml with the user's function: the user's config file, one run."""
    raw = yaml.safe_load(SMOKE.read_text())
    for section, values in SETTINGS.items():
        raw.setdefault(section, {}).update(values)
    config = home / "function.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = home / "summary.json"
    path = os.pathsep.join(filter(None, [str(home / "user_code"), os.environ.get("PYTHONPATH")]))
    proc = run_cli(
        home, "run", "--config", str(config), "--summary-json", str(out), PYTHONPATH=path
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


@pytest.fixture(scope="module")
def client(home, function_run):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


def _metric_steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_asha_stops_trials_on_what_the_function_reports(function_run, client):
    summary, _ = function_run
    fates = [trial["status"] for trial in summary["sweep"]["trials"]]
    assert len(fates) == 4 and "errored" not in fates, fates
    assert fates.count("stopped-early") >= 1, fates
    experiment = client.get_run(summary["mlflow"]["parent_run_id"]).info.experiment_id
    runs = client.search_runs([experiment], max_results=100)
    trials = [r for r in runs if r.data.tags.get("trainflow.stage") == "trial"]
    assert len(trials) == 4
    for trial in trials:  # the function's metrics, once per epoch the trial ran
        epochs = (
            int(trial.data.tags["trainflow.stopped_at_iteration"] or 3)
            if (trial.data.tags.get("trainflow.fate") == "stopped-early")
            else 3
        )
        assert _metric_steps(client, trial.info.run_id, "val_accuracy") == list(
            range(1, epochs + 1)
        ), trial.data.tags


def test_the_crashed_worker_resumed_from_the_functions_checkpoint_each_epoch_logged_once(
    home, function_run, client
):
    summary, proc = function_run
    markers = sorted(p.name for p in (home / "markers").iterdir())
    assert markers == ["crashed", "resumed-at-epoch-2"], markers
    events = run_log_of(proc).read_text()  # every progress event; the console prints a few
    assert "worker(s) 1 failed; Ray Train restarts the group" in events
    train_run = summary["mlflow"]["train_run_id"]
    for key in ("val_accuracy", "train_loss"):
        assert _metric_steps(client, train_run, key) == [1, 2, 3], key
    assert "Ray Dashboard http://127.0.0.1:" in proc.stdout
    assert summary["ray_dashboard"] is None  # the local instance stopped with the run


def test_the_champion_answers_on_the_raw_table_without_trainflow_or_the_user_code(
    home, function_run, client
):
    summary, _ = function_run
    assert summary["model"]["decision"] == "first-model"
    assert summary["test_metrics"]["test_accuracy"] > 0.7, summary["test_metrics"]
    champion_scores_digits_alone(home, client, PACKAGE, "digits-function")
