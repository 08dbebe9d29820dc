"""``train.engine: function``: the config's checks, the dict the user's function gets, its
checks before anything starts (through the CLI: one line, exit 2, no Ray), the report contract
and history, and a checkpoint's ``model.pt`` as the state trainflow evaluates. No Ray."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from training.config import validate_config
from training.errors import ConfigError, FunctionContractError
from training.loop.function_checkpoint import function_checkpoint_state
from training.loop.function_engine import check_function, function_config
from training.loop.function_reports import ReportContract, ReportHistory
from training.manifest import FeatureSpec

PACKAGE = "tf_unit_user_loop"
USER_CODE = """
import math
from torch import nn

def build(spec, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width),
                         nn.ReLU(), nn.Linear(width, spec.num_outputs))

def train_func(config):
    pass

def with_defaults(config, *, verbose=False):
    pass

def two_args(config, other):
    pass

def no_args():
    pass

NOT_CALLABLE = 3
"""
FACTORY = f"{PACKAGE}.loop:build"


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loop.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [n for n in sys.modules if n.split(".")[0] == PACKAGE]:
        del sys.modules[name]


def _raw(function: str = f"{PACKAGE}.loop:train_func", **train) -> dict:
    return {
        "model": {"kind": "custom", "factory": FACTORY, "params": {"width": 8}},
        "train": {"engine": "function", "function": function, **train},
    }


# -- the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"train": {"engine": "function"}}, "engine function needs it"),
        ({"train": {"function": "a.b:f"}}, "train.function goes with train.engine=function"),
        (
            {"train": {"engine": "function", "function": "a.b:f"}},
            "train.engine=function needs model.kind: custom with model.factory",
        ),
        (_raw("not a path"), "give 'package.module:function'"),
        (
            _raw(compile=True, eval_every_steps=5, profile={"steps": 2}, grad_accum_steps=2),
            "train.eval_every_steps, train.compile, train.profile, train.grad_accum_steps: "
            "trainflow's loop only (train.engine=loop); your train.function owns its loop",
        ),
        (_raw(strategy="fsdp"), "train.engine=function trains with DDP"),
    ],
)
def test_the_config_refuses_what_the_function_engine_cannot_use(raw, message):
    with pytest.raises(ConfigError, match="invalid configuration") as caught:
        validate_config(raw)
    assert message in str(caught.value)


def test_the_hf_trainer_still_names_its_own_loop_only_keys():
    raw = {"model": {"kind": "hf", "hf": {"name_or_path": "x"}}, "train": {"engine": "hf_trainer"}}
    raw["train"]["compile"] = True
    with pytest.raises(ConfigError) as caught:
        validate_config(raw)
    assert "train.compile: trainflow's loop only (train.engine=loop); train.hf_args" in str(
        caught.value
    )


def test_the_function_gets_plain_data_with_the_swept_keys_under_their_short_names():
    config = validate_config(
        {
            **_raw(lr=0.01, batch_size=32, seed=7),
            "sweep": {
                "search_space": {
                    "train.lr": {"loguniform": [1e-3, 1e-2]},
                    "train.warmup_ratio": {"uniform": [0.0, 0.2]},
                    "model.params.width": {"choice": [8, 16]},
                }
            },
        }
    ).with_overrides({"train.warmup_ratio": 0.1, "model.params.width": 16})
    spec = FeatureSpec(
        label_column="label",
        classes=[3, 5, 8],
        input_shape=[4],
        mean=[0.0] * 4,
        std=[1.0] * 4,
        cardinalities=[0, 0, 5, 0],
    )
    given = function_config(config, spec, max_epochs=3)
    assert given == {
        "lr": 0.01,
        "batch_size": 32,
        "max_epochs": 3,
        "weight_decay": config.train.weight_decay,
        "seed": 7,
        "warmup_ratio": 0.1,
        "params": {"width": 16},
        "spec": {
            "input_shape": [4],
            "num_outputs": 3,
            "task": "classification",
            "classes": [3, 5, 8],
            "cardinalities": [0, 0, 5, 0],
        },
    }


# -- the function's checks before anything starts ------------------------------------------------


@pytest.mark.parametrize("name", ["train_func", "with_defaults"])
def test_a_function_taking_one_config_passes(user_package, name):
    check_function(f"{PACKAGE}.loop:{name}")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing", "has no attribute 'missing'"),
        ("NOT_CALLABLE", "int is not callable"),
        ("two_args", "cannot be called with one config dict"),
        ("no_args", "cannot be called with one config dict"),
    ],
)
def test_a_function_that_cannot_be_called_with_a_config_is_refused(user_package, name, message):
    with pytest.raises(ConfigError, match=f"train.function='{PACKAGE}.loop:{name}'") as caught:
        check_function(f"{PACKAGE}.loop:{name}")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("tf_nowhere.loop:train_func", "cannot import 'tf_nowhere.loop'"),
        (f"{PACKAGE}.loop:NOT_CALLABLE", "int is not callable"),
        (f"{PACKAGE}.loop:two_args", "cannot be called with one config dict"),
    ],
)
def test_the_cli_refuses_a_bad_function_in_one_line_before_ray_starts(
    user_package, tmp_path, monkeypatch, function, message
):
    from trainflow.cli import app
    from training.platform import cluster

    # Ray's own is_initialized() would answer for the whole test process, where another
    # module's fixture may hold an instance: the calls that start or join one are watched.
    started: list[str] = []
    monkeypatch.setattr(cluster, "start_early", lambda *a, **k: started.append("start_early"))
    monkeypatch.setattr(cluster, "connect", lambda *a, **k: started.append("connect"))
    monkeypatch.chdir(tmp_path)
    sets = ["model.kind=custom", f"model.factory={FACTORY}", "train.engine=function"]
    sets.append(f"train.function={function}")
    args = ["run", *[arg for s in sets for arg in ("--set", s)]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "train.function=" in lines[0], lines
    assert started == []


# -- the report contract and the history ---------------------------------------------------------


class _Checkpoint:
    """What the controller's callback is given: a persisted checkpoint's path and filesystem."""

    def __init__(self, path):
        import pyarrow.fs

        self.path, self.filesystem = str(path), pyarrow.fs.LocalFileSystem()


def test_a_report_without_the_ranked_metric_breaks_the_contract():
    contract = ReportContract("pkg.loop:fit", ["val_accuracy", "val_accuracy"])
    contract.after_report(None, [{"val_accuracy": 0.5, "loss": 1.0}], None)
    with pytest.raises(FunctionContractError) as caught:
        contract.after_report(None, [{"loss": 1.0, "val_accuracy": "high"}], None)
    message = str(caught.value)
    assert "'pkg.loop:fit' reported ['loss', 'val_accuracy'] without val_accuracy" in message
    assert "docs/your-training-code.md" in message and "\n" not in message


def test_a_checkpoint_without_model_pt_breaks_the_contract(tmp_path):
    contract = ReportContract("pkg.loop:fit", ["val_accuracy"])
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "model.pt").write_bytes(b"weights")
    contract.after_report(None, [{"val_accuracy": 0.5}], _Checkpoint(tmp_path / "good"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "weights.pt").write_bytes(b"weights")
    with pytest.raises(FunctionContractError, match="reported a checkpoint without model.pt"):
        contract.after_report(None, [{"val_accuracy": 0.5}], _Checkpoint(tmp_path / "bad"))


def test_the_history_has_each_epoch_once_across_a_restart():
    history = ReportHistory()
    history.add({"val_accuracy": 0.5, "note": "text"}, checkpointed=True)
    history.add({"val_accuracy": 0.6}, checkpointed=False)  # epoch 2 not checkpointed
    history.restarted()  # the function resumes from epoch 1's checkpoint
    history.add({"val_accuracy": 0.7}, checkpointed=True)
    history.add({"val_accuracy": 0.8}, checkpointed=True)
    assert history.epochs == [
        {"val_accuracy": 0.5, "epoch": 1},
        {"val_accuracy": 0.7, "epoch": 2},
        {"val_accuracy": 0.8, "epoch": 3},
    ]


def test_a_resumed_run_numbers_its_epochs_after_those_the_train_run_holds():
    history = ReportHistory(epochs_done=4)
    history.add({"val_accuracy": 0.5}, checkpointed=True)
    history.add({"val_accuracy": 0.6}, checkpointed=False)
    history.restarted()
    history.add({"val_accuracy": 0.7}, checkpointed=True)
    assert [row["epoch"] for row in history.epochs] == [5, 6]
    assert history.epoch_of({"val_accuracy": 0.7}) == 6


def test_the_best_checkpoints_epoch_is_the_train_runs_not_the_users_own():
    history = ReportHistory()
    history.add({"val_accuracy": 0.5, "epoch": 0, "step": 10}, checkpointed=True)
    history.add({"val_accuracy": 0.7, "epoch": 1, "step": 20}, checkpointed=True)
    history.add({"val_accuracy": 0.6, "epoch": 2, "step": 30}, checkpointed=True)
    assert history.epoch_of({"val_accuracy": 0.7, "epoch": 1, "step": 20}) == 2
    assert history.epoch_of({"val_accuracy": 0.9}) is None and history.epoch_of({}) is None


def test_a_functions_trial_runs_number_epochs_by_report_not_by_its_own_epoch_key():
    from training.tracking.sweep_runs import trial_step

    result = {
        "training_iteration": 2,
        "epoch": 1,
        "val_accuracy": 0.9,
    }  # a 0-based epoch of its own
    assert trial_step(result, counted=True) == 2 and trial_step(result) == 1


def test_a_contract_error_on_the_controller_becomes_one_line():
    from ray.train import ControllerError

    from training.loop.failures import contract_error, training_error

    broken = FunctionContractError("train.function 'x:y' reported ['loss'] without val_accuracy")
    raised = ControllerError(broken)
    assert str(contract_error(raised)) == str(broken)
    assert training_error(raised, validate_config(_raw("x.y:z")), "/tmp") is broken
    assert contract_error(RuntimeError("other")) is None and contract_error(None) is None


# -- the checkpoint as trainflow's state ---------------------------------------------------------


@pytest.fixture
def spec():
    return FeatureSpec(
        label_column="label", classes=[0, 1, 2], input_shape=[4], mean=[0.0] * 4, std=[1.0] * 4
    )


def test_model_pt_becomes_the_custom_models_state_and_predicts_the_same(
    user_package, tmp_path, spec
):
    from types import SimpleNamespace

    from training.config import ModelConfig
    from training.model.networks import build_model

    config = validate_config(_raw())
    module = __import__(f"{PACKAGE}.loop", fromlist=["build"]).build(
        SimpleNamespace(input_shape=[4], num_outputs=3), width=8
    )
    # Saved from the DDP wrapper: keys under "module." are taken as the module's own.
    weights = {f"module.{k}": v for k, v in module.state_dict().items()}
    torch.save(weights, tmp_path / "model.pt")
    state = function_checkpoint_state(str(tmp_path), config, spec)
    assert state["spec"] == spec.to_dict() and state["model_config"]["factory"] == FACTORY
    network = build_model(ModelConfig(**state["model_config"]), [4], 3)  # as the model does
    network.load_state_dict(state["model"])
    batch = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(network(batch), module(batch))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "has no model.pt"),
        ("module", "holds more than tensors"),
        ("list", "holds a list, not a state_dict"),
        ("wrong", "does not fit the module model.factory="),
    ],
)
def test_a_checkpoint_without_a_loadable_model_pt_breaks_the_contract(
    user_package, tmp_path, spec, content, message
):
    config = validate_config(_raw())
    if content == "module":  # a pickled module: weights_only refuses it
        torch.save(torch.nn.Linear(4, 3), tmp_path / "model.pt")
    elif content == "list":
        torch.save([torch.zeros(1)], tmp_path / "model.pt")
    elif content == "wrong":
        torch.save(torch.nn.Linear(4, 3).state_dict(), tmp_path / "model.pt")
    with pytest.raises(FunctionContractError, match=message) as caught:
        function_checkpoint_state(str(tmp_path), config, spec)
    assert "docs/your-training-code.md" in str(caught.value)
