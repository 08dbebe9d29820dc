"""Ray Train and Ray Tune on one shared local Ray instance, on the real digits."""

from __future__ import annotations

import glob
import os
import pickle
import signal
import sys

import pytest
import ray.cloudpickle as cloudpickle
from ray import tune

from training.config.overrides import load_config
from training.errors import TrainingDivergedError
from training.loop.checkpoint import load_state
from training.loop.trainer import train_final
from training.tune.sweep import run_sweep

pytestmark = pytest.mark.integration

# Test-local train functions are shipped to Ray workers by value, not by module name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _config(*sets: str):
    return load_config(None, ["train.num_workers=2", "train.max_epochs=4", *sets])


def test_two_worker_fit_checkpoints_every_epoch_and_learns(manifest, layout):
    outcome = train_final(_config(), manifest, "fit-2w", layout)
    epochs = [row["epoch"] for row in outcome.history]
    assert epochs == [1, 2, 3, 4]
    assert outcome.history[-1]["val_accuracy"] > 0.85
    # Each epoch's throughput over both ranks: 1,248 training rows (smoke split) in well
    # under a minute, and a share of the step spent waiting on Ray Data.
    for row in outcome.history:
        assert 20 < row["train_rows_per_s"] < 1e7, row
        assert 0 < row["data_wait_share"] < 1, row
    state = load_state(outcome.checkpoint_path)
    assert state["epoch"] in (3, 4)  # the best of the kept checkpoints by val_accuracy
    assert set(state) >= {"model", "optimizer", "scheduler", "spec", "history"}


def test_a_final_fit_validates_every_n_steps_and_profiles_rank_0(manifest, layout):
    """What the workers hand back (Ray Train's return value) for the train stage to log."""
    import json

    config = _config("train.max_epochs=1", "train.eval_every_steps=5", "train.profile={steps: 2}")
    outcome = train_final(config, manifest, "fit-steps", layout)
    steps_per_epoch = -(-manifest.rows["train"] // config.train.batch_size)
    assert [row["step"] for row in outcome.step_metrics] == list(range(5, steps_per_epoch + 1, 5))
    assert {"val_loss", "val_accuracy", "lr"} <= set(outcome.step_metrics[0])
    events = json.loads(outcome.profile["trace"])["traceEvents"]
    profiled = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert profiled == {"ProfilerStep#2", "ProfilerStep#3"}
    assert outcome.profile["top_ops"]["operator"]


def test_diverging_loop_raises_clear_error(manifest, layout):
    config = _config("train.lr=1.0e+6", "train.lr_schedule=constant", "train.max_failures=0")
    with pytest.raises(TrainingDivergedError, match="lower train.lr"):
        train_final(config, manifest, "diverge", layout)


def test_asha_sweep_stops_a_trial_early_and_picks_a_healthy_best(manifest, layout):
    config = load_config(
        None,
        [
            "sweep.num_samples=4",
            "sweep.max_concurrent_trials=2",
            "sweep.asha.max_t=4",
            "sweep.asha.grace_period=1",
            "sweep.asha.reduction_factor=2",
            "sweep.search_space={train.lr: {loguniform: [1.0e-5, 3.0e-2]}}",
        ],
    )
    outcome = run_sweep(config, manifest, "sweep-4", layout)
    statuses = [t.status for t in outcome.trials]
    assert len(statuses) == 4
    assert "stopped-early" in statuses, statuses
    assert outcome.epochs_spent < outcome.epochs_budget == 16
    best = max(
        (t for t in outcome.trials if t.status != "errored"),
        key=lambda t: t.metrics["val_accuracy"],
    )
    assert outcome.best_trial_id == best.trial_id
    assert set(outcome.best_params) == {"train.lr"}
    # Re-running with the same run id restores the finished sweep instead of starting over.
    again = run_sweep(config, manifest, "sweep-4", layout)
    assert {t.trial_id for t in again.trials} == {t.trial_id for t in outcome.trials}


def test_trials_with_two_workers_each_drive_a_torch_trainer(manifest, layout):
    config = load_config(
        None,
        [
            "sweep.workers_per_trial=2",
            "sweep.num_samples=2",
            "sweep.max_concurrent_trials=1",
            "sweep.asha.max_t=2",
            # grace = max_t: no rung to stop at, so both trials must run every epoch.
            "sweep.asha.grace_period=2",
        ],
    )
    outcome = run_sweep(config, manifest, "sweep-ddp", layout)
    assert [t.epochs for t in outcome.trials] == [2, 2]
    assert all(t.metrics["val_accuracy"] > 0.5 for t in outcome.trials)
    # Each trial ran its own Ray Train run (Tune over Train), named after the trial.
    runs = os.listdir(layout.runs_dir("sweep-ddp"))
    assert sorted(r for r in runs if r.startswith("trial-")) == sorted(
        f"trial-{t.trial_id}" for t in outcome.trials
    )


class _InterruptOnce(tune.Callback):
    """Stops the sweep once, after its first trial completes, as Ctrl-C would stop `tune.run`
    (SIGUSR1: Tune saves the experiment, searcher included, and returns). Tune restores its
    callbacks with the experiment, so a marker file keeps the restored one from firing again."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def on_trial_complete(self, iteration, trials, trial, **info):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGUSR1)


def _optuna_study(experiment_dir: str):
    """The OptunaSearch state Tune saved last in the experiment directory (its study)."""
    newest = max(
        glob.glob(os.path.join(experiment_dir, "searcher-state-*.pkl")), key=os.path.getmtime
    )
    with open(newest, "rb") as file:
        return pickle.load(file)["_ot_study"]


@pytest.mark.parametrize("searcher", ["optuna", "random"])
def test_an_interrupted_sweep_resumes_with_its_searcher(manifest, layout, tmp_path, searcher):
    config = load_config(
        None,
        [
            f"sweep.searcher={searcher}",
            "sweep.num_samples=3",
            "sweep.max_concurrent_trials=1",
            "sweep.asha.max_t=2",
            "sweep.asha.grace_period=2",  # no rung: every trial runs both epochs
            "sweep.search_space={train.lr: {loguniform: [1.0e-3, 3.0e-2]}}",
        ],
    )
    run_id = f"sweep-resume-{searcher}"
    marker = str(tmp_path / "interrupted")
    first = run_sweep(config, manifest, run_id, layout, callbacks=[_InterruptOnce(marker)])
    done = {t.trial_id: t for t in first.trials if t.status == "completed"}
    assert os.path.exists(marker) and 1 <= len(done) < 3, [t.status for t in first.trials]

    again = run_sweep(config, manifest, run_id, layout)
    assert again.searcher == searcher
    assert [t.status for t in again.trials] == ["completed"] * 3
    assert len({t.params["train.lr"] for t in again.trials}) == 3
    for trial in again.trials:  # the trials done before the interruption were not re-run
        if trial.trial_id in done:
            assert (trial.params, trial.metrics) == (
                done[trial.trial_id].params,
                done[trial.trial_id].metrics,
            )
            assert [row["epoch"] for row in trial.history] == [1, 2]
    if searcher == "optuna":
        # One study across the restore: the state Tune saved last holds the trials told before
        # the interruption, and only trials of this sweep. (Tune saves the searcher on its own
        # checkpoint period, so the last save may predate the final trials.)
        study = _optuna_study(os.path.join(layout.runs_dir(run_id), "sweep"))
        assert len(study.trials) >= len(done)
        assert {t.state.name for t in study.trials} == {"COMPLETE"}
        assert {t.params["train.lr"] for t in study.trials} <= {
            t.params["train.lr"] for t in again.trials
        }
