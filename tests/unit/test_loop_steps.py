"""The loop's per-step pieces without Ray: the LR schedule per optimizer step (and its resume),
validation every N steps, ``train.compile`` with its eager fallback, ``train.profile``, and how
the train stage logs them to MLflow."""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest
import torch

import training.loop.compiling as compiling
from training.config import TrainConfig
from training.config.overrides import load_config
from training.loop.loop import _train, loop_config
from training.loop.schedule import optimizer_and_schedule, total_steps
from training.manifest import FeatureSpec

SPEC = FeatureSpec(
    label_column="label",
    classes=[0, 1, 2],
    input_shape=[4],
    mean=[0.0] * 4,
    std=[1.0] * 4,
    feature_columns=["a", "b", "c", "d"],
)
ROWS, BATCH = 64, 16  # 4 optimizer steps an epoch, every batch the same shape


def _data(rows: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % 3
    features = torch.randn(rows, 4, generator=generator) * 0.1
    features[:, 0] += labels.float()
    return features, labels


class FakeContext:
    """One in-process rank: fixed batches, reports recorded, a saved state replayed."""

    world_size = 1
    rank = 0
    strategy = "ddp"

    def __init__(self, state=None, fail_at=None):
        self.state, self.fail_at, self.reports = state, fail_at, []
        self.train, self.val = _data(ROWS, 0), _data(32, 1)

    def train_batches(self, epoch, batch_size, start=0):
        for first in range(start * batch_size, ROWS, batch_size):
            yield (
                self.train[0][first : first + batch_size],
                self.train[1][first : first + batch_size],
            )

    def val_batches(self, batch_size):
        yield self.val

    def prepare_model(self, model):
        return model

    def all_reduce_sum(self, values):
        return values

    def latest_state(self):
        return self.state

    def report(self, metrics, state):
        self.reports.append((metrics, state))
        if self.fail_at == (metrics.get("epoch_in_progress"), metrics.get("batch")):
            raise RuntimeError("injected")


def _settings(epochs: int, *sets: str, final: bool = True, **extra):
    config = load_config(
        None, [f"train.batch_size={BATCH}", "train.lr=0.05", "model.dropout=0", *sets]
    )
    rows = {"train": ROWS}
    return {**loop_config(config, SPEC, epochs, split_rows=rows, final=final), **extra}


def _expected_lr(k: int, total: int, warmup: int, lr: float = 0.05) -> float:
    """The LR of optimizer step k + 1, written out independently of training.loop.schedule."""
    if k < warmup:
        return lr * (k + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (k - warmup) / (total - warmup))))


# --- the LR schedule ------------------------------------------------------------------------


def test_cosine_with_warmup_is_a_closed_form_per_optimizer_step():
    train = TrainConfig(lr=0.1, batch_size=10, warmup_ratio=0.25)
    steps = total_steps(train, max_epochs=4, train_rows=95)  # 10 steps an epoch
    assert steps == 40
    optimizer, scheduler = optimizer_and_schedule(torch.nn.Linear(2, 2), train, 4, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(0.01)  # 1/10 of the warm-up's 10 steps
    assert lrs[4] == pytest.approx(0.05)
    assert lrs[9] == pytest.approx(0.1)  # the warm-up's last step: the full LR
    assert lrs[10] == pytest.approx(0.1)  # the cosine starts at 1...
    assert lrs[25] == pytest.approx(0.05)  # ...is halfway at step 10 + 30 / 2...
    assert lrs[39] == pytest.approx(0.05 * (1 + math.cos(math.pi * 29 / 30)))  # ...near 0
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:], strict=False))  # decays every step


def test_constant_with_warmup_ramps_then_holds():
    train = TrainConfig(lr=0.1, batch_size=10, warmup_ratio=0.5, lr_schedule="constant")
    optimizer, scheduler = optimizer_and_schedule(torch.nn.Linear(2, 2), train, 1, 4)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.05, 0.1, 0.1, 0.1])


def test_unknown_rows_fall_back_to_a_per_epoch_cosine():
    train = TrainConfig(lr=0.1, warmup_ratio=0.5)
    assert total_steps(train, 4, None) == 0
    optimizer, scheduler = optimizer_and_schedule(torch.nn.Linear(2, 2), train, 4, 0)
    scheduler.step()  # one epoch
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * (1 + math.cos(math.pi / 4)))


def test_the_loop_trains_each_step_at_the_formulas_lr_and_a_resume_replays_it():
    # 3 epochs x 4 steps, warm-up over ceil(0.25 x 12) = 3 steps; the LR of every step is
    # recorded by validating after each one (its "lr" is the one that step took).
    sets = ["train.warmup_ratio=0.25", "train.eval_every_steps=1"]
    straight = _train(_settings(3, *sets), FakeContext())
    lrs = [row["lr"] for row in straight.step_metrics]
    assert lrs == pytest.approx([_expected_lr(k, 12, 3) for k in range(12)])
    assert [row["lr"] for row in straight.history] == pytest.approx([lrs[3], lrs[7], lrs[11]])
    # Stopped at the mid-epoch checkpoint after batch 2 of epoch 2 (step 6), resumed from it.
    settings = _settings(3, *sets, every_n_batches=2)
    first = FakeContext(fail_at=(2, 2))
    with pytest.raises(RuntimeError, match="injected"):
        _train(settings, first)
    state = first.reports[-1][1]
    assert state["global_step"] == 6 and len(state["step_metrics"]) == 6
    resumed = _train(settings, FakeContext(state=state))
    assert [row["step"] for row in resumed.step_metrics] == list(range(1, 13))
    assert [row["lr"] for row in resumed.step_metrics] == pytest.approx(lrs)
    for got, want in zip(resumed.history, straight.history, strict=True):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)


# --- validation every N steps ---------------------------------------------------------------


def test_validation_every_n_steps_leaves_training_as_it_was():
    run = _train(_settings(2, "train.eval_every_steps=2"), FakeContext())
    assert [row["step"] for row in run.step_metrics] == [2, 4, 6, 8]
    assert set(run.step_metrics[0]) == {"step", "val_loss", "val_accuracy", "lr"}
    # Step 4 ends epoch 1: the same model the epoch's own validation sees.
    assert run.step_metrics[1]["val_loss"] == pytest.approx(run.history[0]["val_loss"])
    assert run.step_metrics[3]["val_accuracy"] == run.history[1]["val_accuracy"]
    plain = _train(_settings(2), FakeContext())
    assert plain.step_metrics == []
    for got, want in zip(run.history, plain.history, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)


def test_a_sweep_trial_neither_validates_every_n_steps_nor_profiles():
    settings = _settings(1, "train.eval_every_steps=1", "train.profile={steps: 1}", final=False)
    assert settings["eval_every_steps"] == settings["profile_steps"] == 0
    run = _train(settings, FakeContext())
    assert run.step_metrics == [] and run.profiler is None


def test_step_metrics_go_to_mlflow_as_step_series_at_the_optimizer_step():
    from training.loop.step_eval import log_step_metrics

    class Tracker:
        def log_history(self, run_id, rows, step_key):
            self.logged = (run_id, rows, step_key)

    tracker = Tracker()
    log_step_metrics(tracker, "r1", [{"step": 50, "val_loss": 2.0, "val_perplexity": 7.39}])
    run_id, rows, step_key = tracker.logged
    assert (run_id, step_key) == ("r1", "step")
    assert rows == [{"step": 50, "step/val_loss": 2.0, "step/val_perplexity": 7.39}]


# --- train.compile --------------------------------------------------------------------------


def _broken_backend(graph_module, example_inputs):
    raise RuntimeError("this backend cannot compile\nsecond line of a long story")


def test_a_backend_that_cannot_compile_warns_once_and_trains_eagerly(monkeypatch, capsys):
    monkeypatch.setattr(compiling, "BACKEND", _broken_backend)
    run = _train(_settings(2, "train.compile=true"), FakeContext())
    out = capsys.readouterr()
    warnings = [line for line in out.out.splitlines() if "train.compile" in line]
    assert len(warnings) == 1, out.out
    assert "this backend cannot compile" in warnings[0] and "training eagerly" in warnings[0]
    assert "second line" not in out.out + out.err and "Traceback" not in out.out + out.err
    assert run.steps is not None and not run.steps.active
    eager = _train(_settings(2), FakeContext())
    for got, want in zip(run.history, eager.history, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)


def test_a_step_that_fails_compiled_is_reset_and_run_again_eagerly(capsys):
    model = torch.nn.Linear(2, 2)
    steps = compiling.CompiledSteps(model)
    resets, calls = [], []

    def step(module):
        calls.append(module)
        if module is not model:  # the compiled module: fails in its backward, say
            raise RuntimeError("backward compile failed")
        return 1.5

    assert steps.run(step, reset=lambda: resets.append(1)) == 1.5
    assert steps.run(step, reset=lambda: resets.append(1)) == 1.5
    assert len(calls) == 3 and resets == [1]  # compiled once, then eager for good
    assert capsys.readouterr().out.count("train.compile") == 1


@pytest.mark.skipif(not shutil.which("cc"), reason="Inductor compiles C++ on a CPU")
def test_a_compiled_model_trains_and_its_checkpoint_loads_into_the_plain_model(capsys):
    from training.tracking.flavour import network_from_state

    started = time.perf_counter()
    ctx = FakeContext()
    run = _train(_settings(2, "train.compile=true"), ctx)
    seconds = time.perf_counter() - started
    assert "train.compile" not in capsys.readouterr().out  # no fallback
    assert run.steps.active
    eager = _train(_settings(2), FakeContext())
    for got, want in zip(run.history, eager.history, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4)
    state = ctx.reports[-1][1]
    assert not [key for key in state["model"] if "_orig_mod" in key]
    model, _ = network_from_state(state)  # strict load into the plain network
    x = _data(8, 2)[0]
    assert torch.allclose(model(x), run.model(x))
    print(f"compiled 2 epochs in {seconds:.1f} s")  # shown with -s: Inductor's compile time


# --- train.profile --------------------------------------------------------------------------


def test_rank_0_profiles_n_steps_after_a_skipped_and_a_warmup_step():
    run = _train(_settings(2, "train.profile={steps: 2}"), FakeContext())
    profile = run.profiler.finish()
    assert profile["trace_name"] == "trace.json"
    events = json.loads(profile["trace"])["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # steps 0 and 1: skipped, warm-up
    table = profile["top_ops"]
    assert table["operator"] and "aten::addmm" in table["operator"]
    assert not [op for op in table["operator"] if op.startswith("ProfilerStep")]
    assert table["self_cpu_ms"] == sorted(table["self_cpu_ms"], reverse=True)


def test_no_profiler_on_other_ranks_or_without_the_key():
    from training.loop.profiling import profiler_for

    assert profiler_for(3, rank=1) is None and profiler_for(0, rank=0) is None


# --- into the train stage's MLflow run ------------------------------------------------------


def test_the_train_run_gets_the_step_series_the_trace_and_the_top_operators(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from training.config import MlflowConfig, PipelineConfig
    from training.loop.records import log_loop_records
    from training.tracking.store import configure

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = configure(PipelineConfig(mlflow=MlflowConfig(experiment="trainflow-loop-steps")))
    parent = tracker.start_parent_run("loop-steps")
    train_run = tracker.start_child_run(parent, "train", stage="train")
    run = _train(
        _settings(1, "train.eval_every_steps=2", "train.profile={steps: 1}"), FakeContext()
    )
    outcome = SimpleNamespace(step_metrics=run.step_metrics, profile=run.profiler.finish())
    log_loop_records(tracker, train_run, outcome)
    history = tracker.client.get_metric_history(train_run, "step/val_loss")
    assert [point.step for point in history] == [2, 4]
    assert history[0].value == pytest.approx(run.step_metrics[0]["val_loss"])
    files = {f.path for f in tracker.client.list_artifacts(train_run, "profile")}
    assert files == {"profile/trace.json", "profile/top_ops.json"}
    local = tracker.client.download_artifacts(train_run, "profile/top_ops.json", str(tmp_path))
    with open(local) as handle:
        table = json.load(handle)  # log_table's form: {"columns": [...], "data": [rows]}
    assert table["columns"][:2] == ["operator", "calls"]
    assert "aten::addmm" in {row[0] for row in table["data"]}
