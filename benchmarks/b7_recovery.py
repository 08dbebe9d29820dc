"""B7: recovery cost, vs a clean run of the same work.

Worker arm: ``training.loop.trainer.train_final`` (2 DDP workers, default data and model) with a
``train_fn`` wrapper whose rank 1 calls ``os._exit(1)`` (no clean-up, like SIGKILL) right after
reporting epoch k of E, once; Ray Train restarts the worker group from the latest checkpoint
(``train.max_failures = 1``). Anchor: the same training without the fault, alternated with it.

Flow arm: the default ``trainflow run --run-id X`` SIGKILLed (its whole process tree) mid-sweep,
once half the sweep's trials have reported and Tune's experiment state is on disk, then run again
with the same ``--run-id`` (cached preprocessing, ``Tuner.restore`` of the sweep). Cost = killed
part + resumed run; anchor: an uninterrupted run. When B4 runs in the same suite its clean runs
alternate with these and serve as the anchor (see b4_orchestration); otherwise B7 runs both.
"""

from __future__ import annotations

import functools
import json
import os
import time
import uuid
from typing import Any

from benchmarks import b4_orchestration as b4
from benchmarks import harness as h
from benchmarks.common import (
    Context,
    fresh_preprocess,
    make_config,
    register_by_value,
    start_ray,
    stop_ray,
)

ID = "B7"
TITLE = "recovery cost: a worker killed mid-training, a flow killed and resumed, vs clean runs"
TIMEOUT_S = (2700, 600)
FIGURES = [
    h.FigureSpec(
        ID,
        "worker_kill_ratio",
        "training wall, a worker killed mid-training ÷ clean",
        "<= 1.5",
        "the same training without the fault",
    ),
    h.FigureSpec(
        ID,
        "flow_kill_ratio",
        "flow killed mid-sweep + resumed (same --run-id) ÷ clean run",
        "<= 1.5",
        "an uninterrupted `trainflow run`",
    ),
    h.FigureSpec(
        ID, "worker_kill_extra_s", "extra seconds of a worker failure", "—", "clean training"
    ),
    h.FigureSpec(
        ID, "flow_kill_extra_s", "extra seconds of a killed + resumed flow", "—", "clean run"
    ),
]


def _crash_once_worker(settings: dict[str, Any], marker: str, crash_after: int) -> list:
    """Rank 1 dies (``os._exit``: no clean-up) right after reporting epoch ``crash_after``."""
    from training.loop.contexts import TrainContext
    from training.loop.loop import run_loop

    class CrashingContext(TrainContext):
        def report(self, metrics, state):
            super().report(metrics, state)
            if self.rank == 1 and metrics["epoch"] == crash_after and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)

    return run_loop(settings, CrashingContext.from_settings(settings))


def _worker_arms(ctx: Context, epochs: int):
    from training.loop.loop import train_worker
    from training.loop.trainer import train_final

    config = make_config(
        {"train.num_workers": 2, "train.max_epochs": epochs, "train.max_failures": 1}
    )
    manifest, _, layout = fresh_preprocess(config, ctx.scratch("storage"))
    crash_after = max(1, epochs // 2)

    def arm(fault: bool):
        def run(rep: int) -> dict[str, Any]:
            marker = str(ctx.workdir / f"crashed-{uuid.uuid4().hex[:6]}")
            train_fn = (
                functools.partial(_crash_once_worker, marker=marker, crash_after=crash_after)
                if fault
                else train_worker
            )
            run_id = f"b7-{'fault' if fault else 'clean'}-{rep}-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            outcome = train_final(config, manifest, run_id, layout, train_fn=train_fn)
            seconds = time.perf_counter() - started
            epochs_seen = [row["epoch"] for row in outcome.history]
            if fault and not os.path.exists(marker):
                raise RuntimeError("the worker fault was never injected")
            if epochs_seen != list(range(1, epochs + 1)):
                raise RuntimeError(f"history is not every epoch once: {epochs_seen}")
            return {
                "seconds": seconds,
                "fault_injected": fault,
                "crash_after_epoch": crash_after if fault else None,
                "epochs": epochs_seen,
                "val_accuracy": outcome.history[-1]["val_accuracy"],
            }

        return run

    return {"clean": arm(False), "worker_killed": arm(True)}


def _flow_samples(ctx: Context, reps: int) -> tuple[dict[str, list], str]:
    """B4's shared clean/killed runs of this suite, or this benchmark's own."""
    shared = ctx.shared_dir / b4.SHARED_FILE if ctx.shared_dir else None
    if shared is not None and shared.exists():
        doc = json.loads(shared.read_text())
        if doc.get("suite_id") == ctx.suite_id and doc.get("killed_resumed"):
            return {"clean": doc["clean"], "killed_resumed": doc["killed_resumed"]}, "B4"
    return b4.flow_samples(ctx, reps, with_recovery=True), "B7"


def run(ctx: Context) -> h.Outcome:
    register_by_value(__name__)
    reps = ctx.reps(3, 1)
    epochs = ctx.pick(8, 2)
    ray = start_ray(4)
    worker = h.run_alternating(_worker_arms(ctx, epochs), reps, label=f"{ID} worker")
    # The flows start Ray instances of their own: two local instances on one machine confuse
    # Ray's clean-up actors (they find "multiple active Ray instances"), so stop ours first.
    stop_ray()
    errors = []
    try:
        flows, source = _flow_samples(ctx, reps)
    except Exception as exc:  # keep the worker figures; report the flow arm's failure
        errors.append(f"flow arm: {type(exc).__name__}: {str(exc)[:2000]}")
        flows, source = {"clean": [], "killed_resumed": []}, "failed"
    clean_s = h.pluck(worker["clean"], "seconds")
    fault_s = h.pluck(worker["worker_killed"], "seconds")
    flow_clean = h.pluck(flows["clean"], "wall_s")
    flow_killed = h.pluck(flows["killed_resumed"], "total_s")
    figures = [
        h.Figure(
            "worker_kill_ratio",
            "training wall, a worker killed mid-training ÷ clean",
            "x",
            h.paired_ratios(fault_s, clean_s),
            anchor="the same training without the fault",
            target=h.Target("<=", 1.5, "<= 1.5"),
        ),
        h.Figure(
            "flow_kill_ratio",
            "flow killed mid-sweep + resumed (same --run-id) ÷ clean run",
            "x",
            h.paired_ratios(flow_killed, flow_clean) if flow_killed else [],
            anchor="an uninterrupted `trainflow run`",
            target=h.Target("<=", 1.5, "<= 1.5"),
        ),
        h.Figure(
            "worker_kill_extra_s",
            "extra seconds of a worker failure",
            "s",
            [a - b for a, b in zip(fault_s, clean_s, strict=True)],
            anchor="clean training",
        ),
        h.Figure(
            "flow_kill_extra_s",
            "extra seconds of a killed + resumed flow",
            "s",
            [a - b for a, b in zip(flow_killed, flow_clean, strict=True)] if flow_killed else [],
            anchor="clean run",
        ),
        h.Figure("worker_clean_s", "clean training wall (2 workers)", "s", clean_s),
        h.Figure(
            "flow_resume_s",
            "resumed run alone (after the kill)",
            "s",
            h.pluck(flows["killed_resumed"], "resume_wall_s"),
        ),
    ]
    restored = [s.get("sweep_restored") for s in flows["killed_resumed"]]
    return h.Outcome(
        figures=figures,
        samples={
            "worker_clean": worker["clean"],
            "worker_killed": worker["worker_killed"],
            # The clean flows' full analyses live in B4.json when shared; keep the walls here.
            "flow_clean": [{"wall_s": s["wall_s"]} for s in flows["clean"]],
            "flow_killed_resumed": flows["killed_resumed"],
        },
        params={
            "reps": reps,
            "train_epochs": epochs,
            "crash_after_epoch": max(1, epochs // 2),
            "train_workers": 2,
            "flow_args": b4.flow_args(ctx) or "(none: the default configuration)",
            "flow_runs_from": source,
            "kill_when": f"{max(1, b4.sweep_samples(ctx) // 2)} trials reported, Tune state saved",
            "ray_start_s": ray.get("_start_s"),
        },
        notes=[
            f"sweep restored from its saved state in {sum(bool(r) for r in restored)} of "
            f"{len(restored)} resumed runs",
        ],
        errors=errors,
    )
