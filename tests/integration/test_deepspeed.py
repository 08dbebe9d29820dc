"""DeepSpeed ZeRO through the loop (issue 34), on 2 CPU workers: DeepSpeed's CPU accelerator over
gloo, as `make test` installs the ``[deepspeed]`` extra (a user's run takes DeepSpeed to GPUs
only; ``training.stages.preflight.check_strategy``).

The tiny GPT-2 trains two epochs from the same batches three times, with two micro-batches per
optimizer step: DDP, ZeRO-2, and ZeRO-3 with its workers killed once after the first epoch's
checkpoint. Both ZeRO runs must end at DDP's weights and AdamW moments: ZeRO-2 shows the
engine's reduction and accumulation equal the loop's, the killed ZeRO-3 run that a resume
restores the partitioned weights, moments, step and LR. Their checkpoints hold full tensors that
load into a plain ``AutoModelForCausalLM``."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle
import torch
from tiny_lm import TINY_GPT2, bbc_manifest, lm_config

from training.loop.trainer import train_final

pytestmark = pytest.mark.integration
deepspeed = pytest.importorskip("deepspeed", reason="the [deepspeed] extra (make test has it)")

# The failing worker travels to Ray workers by value (they cannot import the tests).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Two epochs, two micro-batches a step; the last epoch's checkpoint is the one kept as best.
# The engine sums the same gradients in another order: over 38 Adam steps the weights drift
# from DDP's by ~1e-5 (7e-5 at most seen); a wrong reduction or accumulation moves them by
# tenths (cutting the batch in two other micro-batches alone moved DDP's by 0.28).
SETS = (
    "train.max_epochs=2",
    "train.batch_size=64",
    "train.grad_accum_steps=2",
    "train.lr_schedule=cosine",
    "train.checkpoint.score_attribute=epoch",
    "train.checkpoint.score_order=max",
)


@pytest.fixture(scope="module")
def lm_manifest(ray_local, layout, tmp_path_factory):
    return bbc_manifest(layout, tmp_path_factory.mktemp("lm-data"))


def _killed_once(settings, marker: str):
    """The real worker, whose first attempt dies right after its first checkpoint; the second
    writes whether Ray Train handed it that checkpoint to resume from."""
    import ray.train

    from training.loop import contexts
    from training.loop.loop import train_worker

    if Path(marker).exists() and ray.train.get_context().get_world_rank() == 0:
        Path(f"{marker}.resumed").write_text(str(ray.train.get_checkpoint() is not None))
    original = contexts.TrainContext.report

    def report(self, metrics, state):
        original(self, metrics, state)
        if not Path(marker).exists():
            torch.distributed.barrier()  # both ranks reported before either dies
            if self.rank == 0:
                Path(marker).write_text("killed after epoch 1")
            raise RuntimeError("injected failure after the first checkpoint")

    contexts.TrainContext.report = report
    try:
        return train_worker(settings)
    finally:
        contexts.TrainContext.report = original


def _final_state(outcome) -> dict:
    return torch.load(Path(outcome.checkpoint_path) / "state.pt", weights_only=True)


@pytest.fixture(scope="module")
def runs(lm_manifest, layout, tmp_path_factory):
    manifest, source = lm_manifest
    ddp = train_final(lm_config(source, *SETS), manifest, "lm-ddp", layout)
    zero2 = train_final(
        lm_config(source, *SETS, "train.strategy=deepspeed", "train.deepspeed.stage=2"),
        manifest,
        "lm-zero2",
        layout,
    )
    marker = tmp_path_factory.mktemp("killed") / "marker"
    zero3 = train_final(
        lm_config(source, *SETS, "train.strategy=deepspeed", "train.deepspeed.stage=3"),
        manifest,
        "lm-zero3",
        layout,
        train_fn=functools.partial(_killed_once, marker=str(marker)),
    )
    assert marker.exists(), "the ZeRO-3 run was never killed, so never resumed"
    assert Path(f"{marker}.resumed").read_text() == "True", "restarted without its checkpoint"
    return {
        name: (run, _final_state(run))
        for name, run in [("ddp", ddp), ("zero2", zero2), ("zero3", zero3)]
    }


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_zero_ends_at_ddps_weights_from_the_same_batches(runs, stage):
    (ddp, ddp_state), (run, state) = runs["ddp"], runs[stage]
    assert [h["epoch"] for h in run.history] == [1, 2]
    assert state["epoch"] == 2 and state["global_step"] == ddp_state["global_step"] > 2
    assert state["model"].keys() == ddp_state["model"].keys()
    for key, value in ddp_state["model"].items():
        assert state["model"][key].shape == value.shape, key  # full tensors, not partitions
        torch.testing.assert_close(state["model"][key], value, rtol=0, atol=1e-3, msg=key)
    for ours, theirs in zip(run.history, ddp.history, strict=True):
        assert ours["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-4)
        assert ours["lr"] == pytest.approx(theirs["lr"])


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_zero_checkpoints_adamws_full_moments_by_parameter_name(runs, stage):
    (_, ddp_state), (_, state) = runs["ddp"], runs[stage]
    by_index = ddp_state["optimizer"]["state"]  # a plain AdamW's: keyed by parameter index
    by_name = state["optimizer"]["state"]
    assert len(by_name) == len(by_index) > 0
    assert all(name.startswith("model.") for name in by_name)  # the network's own names
    for index, name in enumerate(by_name):
        assert float(by_name[name]["step"]) == float(by_index[index]["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            ours, theirs = by_name[name][key], by_index[index][key]
            assert ours.shape == theirs.shape, name
            # The weights' drift moves the gradients a little: up to 3% of a small tensor's
            # moments seen (wpe's exp_avg). A gather of the wrong partitions, or gradients
            # summed instead of averaged over the ranks, is off by ~100%.
            assert (ours - theirs).norm() <= 0.1 * theirs.norm(), (name, key)
    assert (
        state["optimizer"]["param_groups"][0]["lr"]
        == ddp_state["optimizer"]["param_groups"][0]["lr"]
    )


def test_a_zero3_checkpoint_loads_into_a_plain_causal_lm(runs):
    from transformers import AutoConfig, AutoModelForCausalLM

    _, state = runs["zero3"]
    architecture = dict(state["model_config"]["hf"]["config"])
    assert architecture["n_layer"] == TINY_GPT2["n_layer"]
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**architecture))
    weights = {k.removeprefix("model."): v for k, v in state["model"].items()}
    plain.load_state_dict(weights)  # strict: every key, full shapes, fp32
    assert all(v.dtype == torch.float32 for v in weights.values())
