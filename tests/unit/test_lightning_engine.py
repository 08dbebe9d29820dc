"""``train.engine: lightning``: the config's refusals, the factory's LightningModule check and
the missing extra (through the CLI: one line, exit 2, no Ray), the precision mapping, the
report contract's message, and a real Lightning checkpoint as the state trainflow evaluates
and serves. No Ray."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from training.config import validate_config
from training.errors import ConfigError, FunctionContractError
from training.loop.function_checkpoint import user_checkpoint_state
from training.loop.lightning_engine import (
    CHECKPOINT_FILE,
    LoggedMetricsContract,
    lightning_precision,
    lightning_settings,
)
from training.manifest import FeatureSpec
from training.model.factory import ModelSpec, check_factory

pl = pytest.importorskip("lightning.pytorch", reason="the [lightning] extra (make test has it)")

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "tf_unit_user_lightning"
USER_CODE = """
import math

import lightning.pytorch as pl
import torch
from torch import nn


class Classifier(pl.LightningModule):
    def __init__(self, spec, width=8):
        super().__init__()
        self.save_hyperparameters()  # the factory's spec among them
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width),
                                 nn.ReLU(), nn.Linear(width, spec.num_outputs))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        features, label = batch
        return nn.functional.cross_entropy(self(features), label)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def build(spec, width=8):
    return Classifier(spec, width)


def plain(spec, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), spec.num_outputs))


def older(spec, width=8):
    import pytorch_lightning

    class Old(pytorch_lightning.LightningModule):
        def forward(self, x):
            return x

    return Old()
"""
FACTORY = f"{PACKAGE}.module:build"


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "module.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [n for n in sys.modules if n.split(".")[0] == PACKAGE]:
        del sys.modules[name]


def _raw(factory: str = FACTORY, **train) -> dict:
    return {
        "model": {"kind": "custom", "factory": factory, "params": {"width": 8}},
        "train": {"engine": "lightning", **train},
        "sweep": {"search_space": {"model.params.width": {"choice": [8, 16]}}},
    }


# -- the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"train": {"engine": "lightning"}},
            "train.engine=lightning needs model.kind: custom with model.factory",
        ),
        (
            _raw(strategy="deepspeed"),
            "train.engine=lightning trains with DDP or FSDP: train.strategy=deepspeed is the "
            "loop's",
        ),
        (
            _raw(compile=True, eval_every_steps=5, profile={"steps": 2}, grad_accum_steps=2),
            "train.eval_every_steps, train.compile, train.profile, train.grad_accum_steps: "
            "trainflow's loop only (train.engine=loop); Lightning's Trainer runs your "
            "LightningModule",
        ),
        (_raw(checkpoint={"every_n_batches": 10}), "train.engine=lightning checkpoints at epoch"),
        (_raw(strategy="fsdp"), "train.strategy=fsdp trains on GPUs (Lightning's FSDP needs CUDA)"),
        (
            {**_raw(), "sweep": {}},  # the default space sweeps train.lr, model.dropout, ...
            "sweep.search_space train.lr, train.weight_decay, model.dropout: "
            "train.engine=lightning does not read them",
        ),
    ],
)
def test_the_config_refuses_what_the_lightning_engine_cannot_use(raw, message):
    with pytest.raises(ConfigError, match="invalid configuration") as caught:
        validate_config(raw)
    assert message in str(caught.value)


def test_fsdp_the_factorys_keywords_and_an_unswept_default_space_are_taken():
    fsdp = validate_config(_raw(strategy="fsdp", use_gpu=True, backend="nccl"))
    assert fsdp.train.strategy == "fsdp"
    unswept = {**_raw(), "sweep": {"enabled": False}}
    assert validate_config(unswept).train.epochs_from_reports


@pytest.mark.parametrize(("ours", "theirs"), [("fp32", "32-true"), ("bf16", "bf16-mixed")])
def test_train_precision_maps_to_lightnings(ours, theirs):
    assert lightning_precision(ours) == theirs
    config = validate_config(_raw(precision=ours, batch_size=32, seed=3))
    settings = lightning_settings(config, _spec(), max_epochs=2)
    assert settings["precision"] == theirs
    assert (settings["batch_size"], settings["seed"], settings["max_epochs"]) == (32, 3, 2)


# -- the factory's module, checked before anything starts ----------------------------------------


def test_a_factory_returning_a_lightning_module_passes(user_package):
    config = validate_config(_raw())
    check_factory(config.model, ModelSpec.of([4], 3), lightning=True)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("plain", "it returned Sequential, not a lightning.pytorch.LightningModule"),
        ("older", "import LightningModule from lightning.pytorch"),
    ],
)
def test_a_factory_returning_anything_else_is_refused(user_package, name, message):
    config = validate_config(_raw(f"{PACKAGE}.module:{name}"))
    with pytest.raises(ConfigError, match=f"model.factory='{PACKAGE}.module:{name}'") as caught:
        check_factory(config.model, ModelSpec.of([4], 3), lightning=True)
    assert message in str(caught.value)


def _cli_run(tmp_path, monkeypatch, factory: str):
    from trainflow.cli import app
    from training.platform import cluster

    # Ray's own is_initialized() would answer for the whole test process, where another
    # module's fixture may hold an instance: the calls that start or join one are watched.
    started: list[str] = []
    monkeypatch.setattr(cluster, "start_early", lambda *a, **k: started.append("start_early"))
    monkeypatch.setattr(cluster, "connect", lambda *a, **k: started.append("connect"))
    monkeypatch.chdir(tmp_path)
    sets = ["model.kind=custom", f"model.factory={factory}", "train.engine=lightning"]
    sets.append("sweep.enabled=false")
    result = CliRunner().invoke(app, ["run", *[arg for s in sets for arg in ("--set", s)]])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert started == []
    return lines[0]


def test_the_cli_refuses_a_factory_that_returns_no_lightning_module_in_one_line(
    user_package, tmp_path, monkeypatch
):
    line = _cli_run(tmp_path, monkeypatch, f"{PACKAGE}.module:plain")
    assert "not a lightning.pytorch.LightningModule" in line and "model.factory=" in line


def test_without_the_extra_the_cli_names_it_in_one_line(user_package, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)  # as if it were not installed
    line = _cli_run(tmp_path, monkeypatch, FACTORY)
    assert "pip install -e '.[lightning]'" in line, line


# -- what the module logs, and its checkpoint ----------------------------------------------------


def test_an_epoch_without_the_ranked_metric_names_self_log():
    contract = LoggedMetricsContract(FACTORY, ["val_accuracy", "val_accuracy"])
    contract.after_report(None, [{"val_accuracy": 0.5, "epoch": 0}], object())  # no file check
    with pytest.raises(FunctionContractError) as caught:
        contract.after_report(None, [{"train_loss": 1.0, "epoch": 0}], None)
    message = str(caught.value)
    logged = f"model.factory '{FACTORY}' logged ['epoch', 'train_loss'] without val_accuracy"
    assert logged in message
    assert "self.log(name, value, sync_dist=True)" in message and "\n" not in message


def _spec() -> FeatureSpec:
    return FeatureSpec(
        label_column="label", classes=[0, 1, 2], input_shape=[4], mean=[0.0] * 4, std=[1.0] * 4
    )


def _lightning_checkpoint(directory, module) -> None:
    """What Ray's RayTrainReportCallback saves: a Trainer's full checkpoint after an epoch."""
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
    batches = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=batches)
    trainer.save_checkpoint(str(directory / CHECKPOINT_FILE), weights_only=False)


def test_a_lightning_checkpoint_becomes_the_custom_models_state_and_predicts_the_same(
    user_package, tmp_path
):
    from training.config import ModelConfig
    from training.model.networks import build_model
    from training.tracking.flavour import requirements
    from training.tracking.servable import servable_state_file

    config, spec = validate_config(_raw()), _spec()
    module = __import__(f"{PACKAGE}.module", fromlist=["build"]).build(
        ModelSpec.of([4], 3), width=8
    )
    _lightning_checkpoint(tmp_path, module)
    state = user_checkpoint_state(str(tmp_path), config, spec)
    assert state["engine"] == "lightning" and state["model_config"]["factory"] == FACTORY
    network = build_model(ModelConfig(**state["model_config"]), [4], 3)  # as the model does
    network.load_state_dict(state["model"])
    batch = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(network(batch), module.eval()(batch))
    torch.save(state, tmp_path / "state.pt")  # the registered model declares Lightning
    _, model_config = servable_state_file(str(tmp_path / "state.pt"), str(tmp_path))
    pins = requirements(lightning=model_config.get("engine") == "lightning")
    assert any(pin.startswith("lightning==") for pin in pins)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "has no checkpoint.ckpt"),
        ("module", "holds more than tensors"),
        ("weights only", r"has no state_dict \(not a Lightning checkpoint\)"),
        ("wrong", "does not fit the module model.factory="),
    ],
)
def test_a_checkpoint_that_does_not_load_into_the_factorys_module_is_named(
    user_package, tmp_path, content, message
):
    config = validate_config(_raw())
    path = tmp_path / CHECKPOINT_FILE
    if content == "module":  # a pickled module: weights_only refuses it
        torch.save({"state_dict": torch.nn.Linear(4, 3)}, path)
    elif content == "weights only":
        torch.save(torch.nn.Linear(4, 3).state_dict(), path)
    elif content == "wrong":
        torch.save({"state_dict": torch.nn.Linear(4, 3).state_dict()}, path)
    with pytest.raises(FunctionContractError, match=message) as caught:
        user_checkpoint_state(str(tmp_path), config, _spec())
    assert "docs/your-training-code.md" in str(caught.value)


def test_the_example_config_and_module_pass_the_checks_before_anything_starts(monkeypatch):
    import yaml

    example = REPO_ROOT / "examples" / "lightning"
    monkeypatch.syspath_prepend(str(example))
    config = validate_config(yaml.safe_load((example / "config.yaml").read_text()))
    assert config.train.engine == "lightning"
    check_factory(config.model, ModelSpec.of([64], 10), {"width": 32, "lr": 1e-3}, lightning=True)
    for name in [n for n in sys.modules if n.split(".")[0] == "my_lightning"]:
        del sys.modules[name]


class _Shard:
    """What ``ray.train.get_dataset_shard`` gives, as far as the batches go: dict batches."""

    def __init__(self, rows: int) -> None:
        self.features, self.labels = torch.randn(rows, 4), torch.randint(0, 3, (rows,))

    def iter_torch_batches(self, batch_size: int):
        for start in range(0, len(self.labels), batch_size):
            end = start + batch_size
            yield {"features": self.features[start:end], "label": self.labels[start:end]}


def test_the_module_gets_tuples_each_epoch_and_its_validation_is_logged_before_the_report():
    from training.loop.lightning_engine import ShardBatches

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.shapes = torch.nn.Linear(4, 3), set()

        def training_step(self, batch, batch_idx):
            features, label = batch
            self.shapes.add((tuple(features.shape[1:]), label.dtype))
            return torch.nn.functional.cross_entropy(self.net(features), label)

        def validation_step(self, batch, batch_idx):
            features, label = batch
            accuracy = (self.net(features).argmax(1) == label).float().mean()
            self.log("val_accuracy", accuracy, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Reports(pl.Callback):  # where Ray's RayTrainReportCallback reads the metrics
        def __init__(self):
            self.reported = []

        def on_train_epoch_end(self, trainer, module):
            self.reported.append(sorted(trainer.callback_metrics))

    reports, module = Reports(), Module()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        callbacks=[reports],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        module,
        train_dataloaders=ShardBatches(_Shard(20), 8, [4]),
        val_dataloaders=ShardBatches(_Shard(10), 8, [4]),
    )
    assert module.shapes == {((4,), torch.int64)}
    assert reports.reported == [["val_accuracy"], ["val_accuracy"]]
