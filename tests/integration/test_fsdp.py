"""train.strategy=fsdp on CPUs: two Ray Train workers over gloo, FullyShardedDataParallel, and
checkpoints holding the full, unsharded state (so evaluation and the registered model read them
as they read a DDP run's). One module-scoped training, resumed once, many checks."""

from __future__ import annotations

import pytest

from training.config.overrides import load_config
from training.inference.evaluate import evaluate_state
from training.loop.checkpoint import load_state
from training.loop.trainer import train_final
from training.model.networks import build_model

pytestmark = pytest.mark.integration

# A constant LR: the cosine, per optimizer step, would decay to 0 within the first run's one
# epoch, and these checks are about sharding, not the schedule (tests/unit/test_loop_steps.py).
SETS = [
    "train.num_workers=2",
    "train.strategy=fsdp",
    "model.hidden_sizes=[64]",
    "train.lr_schedule=constant",
]


@pytest.fixture(scope="module")
def fsdp_runs(manifest, layout):
    """One epoch, then the same run id with two: Ray Train resumes from epoch 1's checkpoint
    (optimizer moments loaded into every rank's shard) and trains one more."""
    first = train_final(load_config(None, [*SETS, "train.max_epochs=1"]), manifest, "fsdp", layout)
    again = train_final(load_config(None, [*SETS, "train.max_epochs=2"]), manifest, "fsdp", layout)
    return first, again


def test_fsdp_trains_on_two_cpu_workers_and_learns(fsdp_runs):
    first, again = fsdp_runs
    assert [row["epoch"] for row in first.history] == [1]
    assert first.history[0]["workers"] == 2.0
    # resumed, not restarted: the history kept epoch 1 and added the second
    assert [row["epoch"] for row in again.history] == [1, 2]
    assert again.history[:1] == first.history
    assert again.history[-1]["val_accuracy"] > 0.8, again.history


def test_fsdp_checkpoints_hold_the_full_state_dict_a_ddp_model_has(fsdp_runs, manifest):
    _, again = fsdp_runs
    state = load_state(again.checkpoint_path)
    config = load_config(None, SETS)
    reference = build_model(config.model, manifest.spec.input_shape, manifest.spec.num_classes)
    want = {key: tuple(value.shape) for key, value in reference.state_dict().items()}
    assert {key: tuple(value.shape) for key, value in state["model"].items()} == want
    reference.load_state_dict(state["model"])  # strict: no FSDP prefixes, no flat params
    # The optimizer's full state: moments for every parameter, by name, at full size.
    moments = state["optimizer"]["state"]
    assert {key: tuple(value["exp_avg"].shape) for key, value in moments.items()} == {
        key: shape for key, shape in want.items()
    }
    assert state["model_config"]["hidden_sizes"] == [64]


def test_an_fsdp_checkpoint_evaluates_through_the_pyfunc_like_ddp(fsdp_runs, manifest):
    _, again = fsdp_runs
    result, _ = evaluate_state(load_state(again.checkpoint_path), manifest)
    assert result.metrics["test_accuracy"] > 0.8, result.metrics
    assert result.metrics["test_rows"] > 200
