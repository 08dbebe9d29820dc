"""B6: sweep bookkeeping, many short trials on 2 CPUs vs the theoretical minimum.

Bookkeeping arm: N = 200 trials that each sleep t = 0.2 s and report once, run by a Tuner
configured exactly as ``training.tune.sweep.run_sweep`` configures ours for function trials
(BasicVariantGenerator with ``max_concurrent = 2``, ASHA, 1 CPU per trial, ``reuse_actors=True``,
storage under a run directory, checkpoint retention, ``verbose=0``) on a local Ray instance with
2 logical CPUs. Anchor: the theoretical minimum N * t / 2. Two informational arms show where the
time goes: Tune's default ``reuse_actors=False`` (a new trial process per trial; 40 trials, as
each costs seconds) and the same 200 sleeps as plain Ray tasks (Ray's own scheduling, no Tune).

Second part: the fixed per-trial cost of a trial that drives a TorchTrainer
(``sweep.workers_per_trial = 2``) vs a plain function trial (the default), each a real one-epoch
trial of our sweep on the default data, run alternately.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks.common import (
    Context,
    fresh_preprocess,
    make_config,
    register_by_value,
    start_ray,
    stop_ray,
)

ID = "B6"
TITLE = "sweep bookkeeping: many short trials on 2 CPUs vs the theoretical minimum"
TIMEOUT_S = (1200, 240)
CPUS = 2
FIGURES = [
    h.FigureSpec(
        ID,
        "bookkeeping_ratio",
        "sweep wall ÷ theoretical minimum (N x t / 2 CPUs)",
        "<= 1.2",
        "N x t / CPUs",
    ),
    h.FigureSpec(
        ID,
        "bookkeeping_ratio_fresh_actors",
        "same with Tune's default reuse_actors=False (40 trials)",
        "—",
        "N x t / CPUs",
    ),
    h.FigureSpec(
        ID, "ray_tasks_ratio", "same sleeps as plain Ray tasks ÷ minimum", "—", "N x t / CPUs"
    ),
    h.FigureSpec(
        ID,
        "per_trial_overhead_s",
        "sweep overhead per trial ((wall - minimum) x 2 / N)",
        "—",
        "0 s",
    ),
    h.FigureSpec(
        ID,
        "trial_s_trainer",
        "one-epoch trial driving a TorchTrainer (2 workers), s per trial",
        "—",
        "function trial",
    ),
    h.FigureSpec(ID, "trial_s_function", "one-epoch function trial, s per trial", "—", "—"),
]


def _sleep_trial(params: dict[str, Any], seconds: float) -> None:
    import ray.tune

    time.sleep(seconds)
    ray.tune.report({"val_accuracy": float(params["x"])})


def _sleep_task(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _bookkeeping_arm(storage: Path, trials: int, seconds: float, reuse: bool):
    """``reuse``: as ``run_sweep`` runs function trials (True) or Tune's default (False)."""

    def run(rep: int) -> dict[str, Any]:
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
        from ray.tune.search.basic_variant import BasicVariantGenerator

        # The Tuner as training.tune.sweep.run_sweep builds it; only the trainable differs.
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_sleep_trial, seconds=seconds), {"cpu": 1}),
            param_space={"x": tune.uniform(0, 1)},
            tune_config=tune.TuneConfig(
                metric="val_accuracy",
                mode="max",
                num_samples=trials,
                search_alg=BasicVariantGenerator(random_state=rep, max_concurrent=CPUS),
                scheduler=ASHAScheduler(time_attr="training_iteration", max_t=1, grace_period=1),
                reuse_actors=reuse,
            ),
            run_config=tune.RunConfig(
                name=f"b6-{'reuse' if reuse else 'sweep'}-{rep}-{uuid.uuid4().hex[:6]}",
                storage_path=str(storage),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                verbose=0,
            ),
        )
        started = time.perf_counter()
        grid = tuner.fit()
        wall = time.perf_counter() - started
        errors = sum(1 for r in grid if r.error is not None)
        return {"wall_s": wall, "trials": len(grid), "errored": errors}

    return run


def _ray_tasks_arm(trials: int, seconds: float):
    def run(rep: int) -> dict[str, Any]:
        import ray

        task = ray.remote(num_cpus=1)(_sleep_task)
        started = time.perf_counter()
        ray.get([task.remote(seconds) for _ in range(trials)])
        return {"wall_s": time.perf_counter() - started, "trials": trials}

    return run


def _trial_overhead_arms(ctx: Context, trials: int):
    from training.tune.sweep import run_sweep

    base = {
        "sweep.num_samples": trials,
        "sweep.max_concurrent_trials": 1,
        "sweep.asha.max_t": 1,
        "sweep.asha.grace_period": 1,
        "sweep.search_space": {"train.lr": {"loguniform": [1e-3, 1e-2]}},
    }
    config = make_config(base)
    manifest, _, layout = fresh_preprocess(config, ctx.scratch("storage"))

    def arm(workers: int):
        def run(rep: int) -> dict[str, Any]:
            cfg = make_config({**base, "sweep.workers_per_trial": workers})
            started = time.perf_counter()
            outcome = run_sweep(
                cfg, manifest, f"b6-w{workers}-{rep}-{uuid.uuid4().hex[:6]}", layout
            )
            wall = time.perf_counter() - started
            return {
                "wall_s": wall,
                "trials": len(outcome.trials),
                "s_per_trial": wall / len(outcome.trials),
                "epochs": [t.epochs for t in outcome.trials],
            }

        return run

    return {"trainer_trial": arm(2), "function_trial": arm(1)}


def run(ctx: Context) -> h.Outcome:
    register_by_value(__name__)
    trials = ctx.pick(200, 8)
    # A fresh trial process costs ~1.5-3 s here: Tune's default arm gets fewer trials.
    fresh_trials = ctx.pick(40, 4)
    seconds = ctx.pick(0.2, 0.05)
    reps = ctx.reps(3, 1)
    ray = start_ray(CPUS)
    minimum = trials * seconds / CPUS
    fresh_minimum = fresh_trials * seconds / CPUS
    storage = ctx.scratch("tune")
    arms = {
        "sweep": _bookkeeping_arm(storage, trials, seconds, reuse=True),
        "sweep_fresh_actors": _bookkeeping_arm(storage, fresh_trials, seconds, reuse=False),
        "ray_tasks": _ray_tasks_arm(trials, seconds),
    }
    samples = h.run_alternating(arms, reps, label=f"{ID} bookkeeping")
    sweep_wall = h.pluck(samples["sweep"], "wall_s")
    figures = [
        h.Figure(
            "bookkeeping_ratio",
            "sweep wall ÷ theoretical minimum (N x t / 2 CPUs)",
            "x",
            [w / minimum for w in sweep_wall],
            anchor=f"N x t / CPUs = {minimum:g} s",
            target=h.Target("<=", 1.2, "<= 1.2"),
        ),
        h.Figure(
            "bookkeeping_ratio_fresh_actors",
            f"same with Tune's default reuse_actors=False ({fresh_trials} trials)",
            "x",
            [w / fresh_minimum for w in h.pluck(samples["sweep_fresh_actors"], "wall_s")],
            anchor=f"N x t / CPUs = {fresh_minimum:g} s",
        ),
        h.Figure(
            "ray_tasks_ratio",
            "same sleeps as plain Ray tasks ÷ minimum",
            "x",
            [w / minimum for w in h.pluck(samples["ray_tasks"], "wall_s")],
            anchor=f"N x t / CPUs = {minimum:g} s",
        ),
        h.Figure(
            "per_trial_overhead_s",
            "sweep overhead per trial ((wall - minimum) x 2 / N)",
            "s",
            [(w - minimum) * CPUS / trials for w in sweep_wall],
            anchor="0 s",
        ),
    ]
    params: dict[str, Any] = {
        "trials": trials,
        "trials_fresh_actors": fresh_trials,
        "trial_seconds": seconds,
        "cpus": CPUS,
        "minimum_s": minimum,
        "reps": reps,
        "ray_start_s": ray.get("_start_s"),
    }
    overhead_trials = ctx.pick(1, 0)
    if overhead_trials:
        # A TorchTrainer trial with 2 workers needs more than 2 CPUs (its driver and Ray Data
        # tasks too): restart Ray as the pipeline runs it (4 logical CPUs).
        stop_ray()
        params["ray_start_s_4cpu"] = start_ray(4).get("_start_s")
        overhead = h.run_alternating(
            _trial_overhead_arms(ctx, overhead_trials), reps, label=f"{ID} per-trial"
        )
        samples.update(overhead)
        trainer = h.pluck(overhead["trainer_trial"], "s_per_trial")
        function = h.pluck(overhead["function_trial"], "s_per_trial")
        figures += [
            h.Figure(
                "trial_s_trainer",
                "one-epoch trial driving a TorchTrainer (2 workers), s per trial",
                "s",
                trainer,
                anchor="function trial",
            ),
            h.Figure("trial_s_function", "one-epoch function trial, s per trial", "s", function),
            h.Figure(
                "trial_overhead_trainer_minus_function_s",
                "TorchTrainer trial's extra fixed cost over a function trial",
                "s",
                [a - b for a, b in zip(trainer, function, strict=True)],
                anchor="function trial",
            ),
        ]
        params["overhead_trials_per_sweep"] = overhead_trials
    else:
        params["overhead_trials_per_sweep"] = "skipped in smoke (a TorchTrainer trial takes ~20 s)"
    return h.Outcome(
        figures=figures,
        samples=samples,
        params=params,
        notes=[
            "sweep wall = Tuner.fit() only (Ray already running); each trial sleeps then reports "
            "once",
            "per-trial s = Tuner.fit() wall / trials for a one-trial sweep, so it includes the "
            "Tuner's own set-up, the same in both arms",
        ],
    )
