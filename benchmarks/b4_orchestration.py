"""B4: orchestration overhead of the default ``trainflow run``, per stage and in total.

Each repetition runs the default pipeline exactly as a user does (``trainflow run``, default
configuration, a fresh trainflow home, so a fresh embedded Prefect server, MLflow sqlite store and
local Ray) in a subprocess, through ``benchmarks.flowchild``, which wraps the flow, the stage
tasks' bodies and the library calls inside them with stopwatches (see that module).

    overhead = wall time of the process - the time spent inside the stage tasks' bodies

Per stage: the flow's stage clock (``stage_seconds`` of the summary) minus its task bodies.
Outside the stages: interpreter and imports, the CLI, Prefect's temporary server and flow-run
start, MLflow set-up and the parent run, Ray shutdown, Prefect's finish and the process exit.
This also gives the default run's wall time stage by stage (the second table of the docs).

When B7 is in the same suite, its flow-recovery arm (the same run SIGKILLed mid-sweep, then
resumed with the same ``--run-id``) alternates with these clean runs, which serve as its anchor.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import harness as h
from benchmarks.common import REPO_ROOT, Context
from benchmarks.process_tree import kill_tree

ID = "B4"
TITLE = "orchestration overhead: default `trainflow run` wall time minus the stages' work"
TIMEOUT_S = (2700, 600)
SHARED_FILE = "flow_recovery.json"
STAGES = ("preprocess", "sweep", "train", "evaluate", "promote")
STAGE_TASKS = {
    "preprocess": ("task:inspect_data", "task:preprocess"),
    "sweep": ("task:sweep",),
    "train": ("task:train",),
    "evaluate": ("task:evaluate",),
    "promote": ("task:promote",),
}
UNSAMPLED = "mlflow.system_metrics_interval_s=0"
LIBRARY = ("lib:preprocess", "lib:sweep", "lib:train", "lib:evaluate", "lib:promote")
_ANCHOR = "time inside the five stage tasks' bodies (the stages' own work)"
FIGURES = [
    h.FigureSpec(
        ID,
        "overhead_pct",
        "orchestration overhead, % of the default run's wall time",
        "<= 10 %",
        _ANCHOR,
    ),
    h.FigureSpec(ID, "overhead_s", "orchestration overhead, seconds", "—", _ANCHOR),
    h.FigureSpec(ID, "wall_s", "default `trainflow run` wall time", "—", "—"),
    h.FigureSpec(ID, "prefect_start_s", "Prefect temporary server + flow-run start", "—", "—"),
    h.FigureSpec(
        ID,
        "overhead_pct_stack",
        "same run against a running `trainflow up` stack, overhead %",
        "— (reported)",
        _ANCHOR,
    ),
    h.FigureSpec(
        ID,
        "non_library_pct",
        "wall time outside the ML library calls, %",
        "—",
        "data.preprocess, run_sweep, train_final, evaluate_state, model registration",
    ),
]
# Smoke: the smoke config, shrunk further; still every stage, and a sweep long enough to kill.
SMOKE_ARGS = [
    "--config",
    str(REPO_ROOT / "configs" / "smoke.yaml"),
    "--set",
    "sweep.num_samples=4",
    "--set",
    "sweep.asha.max_t=2",
    "--set",
    "train.max_epochs=2",
]


def flow_args(ctx: Context) -> list[str]:
    return ctx.pick([], SMOKE_ARGS)


def sweep_samples(ctx: Context) -> int:
    return ctx.pick(8, 4)  # the default config's sweep.num_samples / the smoke args'


# ---------------------------------------------------------------------------------------------
# Running one `trainflow run`


def _clean_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME")
    }
    env["TRAINFLOW_HOME"] = str(home)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def mid_sweep(threshold: int):
    """A kill condition: the sweep's state is saved and ``threshold`` trials have reported."""

    def check(home: Path, run_id: str) -> bool:
        sweep = home / "storage" / "runs" / run_id / "sweep"
        if not sweep.is_dir() or not any(sweep.glob("experiment_state-*.json")):
            return False
        reported = sum(1 for p in sweep.glob("*/result.json") if p.stat().st_size > 0)
        return reported >= threshold

    return check


def run_flow(
    home: Path, run_id: str, args: list[str], *, kill_when=None, timeout_s: float = 1800
) -> dict[str, Any]:
    """One ``trainflow run --run-id RUN_ID`` in a subprocess; wall time, summary and timings."""
    (home / "cwd").mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    summary, timings, log = (
        home / f"{kind}-{tag}.{ext}"
        for kind, ext in (("summary", "json"), ("timings", "json"), ("log", "txt"))
    )
    cmd = [sys.executable, "-m", "benchmarks.flowchild", "--timings", str(timings), "--", "run"]
    cmd += ["--run-id", run_id, "--summary-json", str(summary), *args]
    killed_at = None
    with open(log, "w") as out:
        started = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=home / "cwd",
            env=_clean_env(home),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                if time.time() - started > timeout_s:
                    kill_tree(proc)
                    raise TimeoutError(f"trainflow run {run_id} took over {timeout_s:.0f} s")
                if kill_when is not None and killed_at is None and kill_when(home, run_id):
                    killed_at = time.time()
                    kill_tree(proc)
                    break
                time.sleep(0.2)
        except BaseException:
            if proc.poll() is None:
                kill_tree(proc)
            raise
    ended = time.time() if killed_at is None else killed_at
    result = {
        "wall_s": ended - started,
        "rc": proc.returncode,
        "killed": killed_at is not None,
        "popen": started,
        "exit": ended,
        "summary": json.loads(summary.read_text()) if summary.exists() else None,
        "timings": json.loads(timings.read_text()) if timings.exists() else None,
    }
    if killed_at is None and proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"trainflow run {run_id} exited with {proc.returncode}:\n{tail}")
    return result


# ---------------------------------------------------------------------------------------------
# Reading one run


def _spans(timings: dict, name: str) -> list[tuple[float, float]]:
    return [tuple(s) for s in timings["spans"].get(name, [])]


def _busy(timings: dict, *names: str) -> float:
    return sum(end - start for name in names for start, end in _spans(timings, name))


def analyse(run: dict[str, Any]) -> dict[str, Any]:
    """Wall time split into parts; each part's stage work (task bodies) and overhead."""
    t, summary = run["timings"], run["summary"]
    if t is None or summary is None:
        raise RuntimeError("the run left no timings or summary (killed or crashed?)")
    marks = t["marks"]
    call_start, call_end = _spans(t, "flow_call")[0]
    first_task = min(s for name in STAGE_TASKS["preprocess"] for s, _ in _spans(t, name))
    last_task = max(e for name in STAGE_TASKS["promote"] for _, e in _spans(t, name))
    # The flow body opens with MLflow set-up (store.configure) and ends with its last artifact;
    # without those stamps, fall back to the first/last task (coarser, never wrong).
    configure = [s for s, _ in _spans(t, "mlflow:configure") if call_start <= s <= first_task]
    body_start = min(configure) if configure else first_task
    artifacts = [e for _, e in _spans(t, "flow:artifact") if last_task <= e <= call_end]
    body_end = max(artifacts) if artifacts else last_task
    wall = run["wall_s"]
    parts: list[dict[str, Any]] = []

    def add(part: str, seconds: float, work: float = 0.0) -> None:
        seconds, work = round(seconds, 3) + 0.0, round(work, 3) + 0.0  # no "-0.0" in tables
        parts.append(
            {"part": part, "wall_s": seconds, "work_s": work, "overhead_s": seconds - work}
        )

    add("python start + imports (prefect, flows, training)", marks["instrumented"] - run["popen"])
    add("CLI: parse, load config, environment", call_start - marks["instrumented"])
    add("Prefect: temporary server + flow-run start", body_start - call_start)
    add("flow set-up: MLflow health check + parent run", first_task - body_start)
    stage_seconds = summary["stage_seconds"]
    for stage in STAGES:
        if stage in stage_seconds:
            add(f"stage {stage}", stage_seconds[stage], _busy(t, *STAGE_TASKS[stage]))
    stages_total = sum(stage_seconds.values())
    add("between stages (flow code)", max(0.0, (last_task - first_task) - stages_total))
    add(
        "after the stages: HTML report (work), summary, Ray shutdown, parent run, artifacts",
        body_end - last_task,
        _busy(t, "flow:report"),
    )
    add("Prefect: flow-run finish", call_end - body_end)
    add("exit: summary, JSON, server stop, interpreter exit", run["exit"] - call_end)
    accounted = sum(p["wall_s"] for p in parts)
    add("unaccounted (stage clocks vs task stamps)", wall - accounted)
    work = sum(p["work_s"] for p in parts)
    library = _busy(t, *LIBRARY)
    return {
        "wall_s": wall,
        "work_s": work,
        "overhead_s": wall - work,
        "overhead_pct": 100 * (wall - work) / wall,
        "library_s": library,
        "non_library_pct": 100 * (wall - library) / wall,
        "prefect_start_s": body_start - call_start,
        "ray_start_s": _busy(t, "ray:connect"),
        "mlflow_configure_s": _busy(t, "mlflow:configure"),
        "stage_seconds": stage_seconds,
        "parts": parts,
        "sweep_epochs": (summary.get("sweep") or {}).get("epochs_spent"),
        "test_accuracy": (summary.get("test_metrics") or {}).get("test_accuracy"),
        "not_timed": t.get("missing", []),
    }


def stage_table(analyses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median of each part over the runs, plus a total row."""
    names = [p["part"] for p in analyses[0]["parts"]]
    rows = []
    for index, name in enumerate(names):
        row = {"part": name}
        for key in ("wall_s", "work_s", "overhead_s"):
            row[key] = h.stats(a["parts"][index][key] for a in analyses)["median"]
        rows.append(row)
    rows.append(
        {
            "part": "total (medians of the runs)",
            **{
                k: h.stats(a[k] for a in analyses)["median"]
                for k in ("wall_s", "work_s", "overhead_s")
            },
        }
    )
    return rows


# ---------------------------------------------------------------------------------------------
# The alternation shared with B7


def recovery_arm(ctx: Context):
    """B7's flow arm: SIGKILL the run mid-sweep, then resume it with the same run id."""
    args = flow_args(ctx)
    threshold = max(1, sweep_samples(ctx) // 2)

    def run(rep: int) -> dict[str, Any]:
        home = ctx.scratch(f"flow-killed-{rep}")
        run_id = f"bench-kill-{rep}"
        killed = run_flow(home, run_id, args, kill_when=mid_sweep(threshold))
        if not killed["killed"]:
            raise RuntimeError("the run finished before it could be killed mid-sweep")
        sweep = home / "storage" / "runs" / run_id / "sweep"
        state_saved = any(sweep.glob("experiment_state-*.json"))
        trials_before = sorted(p.name for p in sweep.iterdir() if p.is_dir())
        resumed = run_flow(home, run_id, args)
        trials_after = sorted(p.name for p in sweep.iterdir() if p.is_dir())
        summary = resumed["summary"] or {}
        return {
            "killed_wall_s": killed["wall_s"],
            "resume_wall_s": resumed["wall_s"],
            "total_s": killed["wall_s"] + resumed["wall_s"],
            "sweep_state_saved_at_kill": state_saved,
            "trials_at_kill": len(trials_before),
            "trials_after_resume": len(trials_after),
            "sweep_restored": state_saved and set(trials_before) <= set(trials_after),
            "resume_stage_seconds": summary.get("stage_seconds"),
            "resume_preprocess_cached": (summary.get("data") or {}).get("preprocess_cached"),
            "resume_test_accuracy": (summary.get("test_metrics") or {}).get("test_accuracy"),
        }

    return run


def _trainflow(home: Path, *args: str, timeout_s: float = 300) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow", *args],
        cwd=home,
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"trainflow {' '.join(args)} exited {proc.returncode}: {proc.stderr}")


@contextlib.contextmanager
def running_stack(ctx: Context):
    """``trainflow up`` in a home of its own, on free ports; ``trainflow down`` after."""
    from training.platform.cluster import free_port

    home = ctx.scratch("flow-stack")
    _trainflow(home, "up", "--prefect-port", str(free_port()), "--mlflow-port", str(free_port()))
    try:
        yield home
    finally:
        _trainflow(home, "down")


def stack_arm(ctx: Context, home: Path):
    """The same default run against a running stack (a Prefect API and an MLflow server already
    up, as scheduled runs find them). A fresh storage root per run: nothing is cached."""
    args = flow_args(ctx)

    def run(rep: int) -> dict[str, Any]:
        storage = ctx.scratch(f"flow-stack-storage-{rep}")
        flow = run_flow(home, f"bench-stack-{rep}", [*args, "--set", f"storage.root={storage}"])
        return analyse(flow)

    return run


def clean_arm(ctx: Context, sets: tuple[str, ...] = (), name: str = "clean"):
    """The default run in a fresh home, with ``sets`` (``key=value``) added to its command."""
    args = [*flow_args(ctx), *(arg for value in sets for arg in ("--set", value))]

    def run(rep: int) -> dict[str, Any]:
        home = ctx.scratch(f"flow-{name}-{rep}")
        return analyse(run_flow(home, f"bench-{name}-{rep}", args))

    return run


def flow_samples(ctx: Context, reps: int, with_recovery: bool) -> dict[str, list]:
    with running_stack(ctx) as stack_home:
        arms = {
            "clean": clean_arm(ctx),
            "stack": stack_arm(ctx, stack_home),
            # What the workers' system-metrics sampling costs: the same run without it.
            "unsampled": clean_arm(ctx, (UNSAMPLED,), "unsampled"),
        }
        if with_recovery:
            arms["killed_resumed"] = recovery_arm(ctx)
        return h.run_alternating(arms, reps, label="flows")


# The figures of the arms beside the clean one: (arm, measure, title, unit).
_OTHER_ARMS = (
    ("stack", "overhead_pct", "same run against a running `trainflow up` stack, overhead %", "%"),
    ("stack", "overhead_s", "same run against a running stack, overhead seconds", "s"),
    ("stack", "wall_s", "same run against a running stack, wall time", "s"),
    ("unsampled", "overhead_pct", "same run without system-metrics sampling, overhead %", "%"),
    ("unsampled", "wall_s", "same run without system-metrics sampling, wall time", "s"),
)


def _other_arm_figures(samples: dict[str, list]) -> list[h.Figure]:
    """Overheads are read against the stages' work (the anchor); a wall time stands alone."""
    return [
        h.Figure(
            f"{measure}_{arm}",
            title,
            unit,
            h.pluck(samples[arm], measure),
            anchor="" if measure == "wall_s" else _ANCHOR,
        )
        for arm, measure, title, unit in _OTHER_ARMS
    ]


def run(ctx: Context) -> h.Outcome:
    reps = ctx.reps(3, 1)
    with_recovery = "B7" in ctx.selection
    samples = flow_samples(ctx, reps, with_recovery)
    if with_recovery and ctx.shared_dir is not None:
        shared = {"suite_id": ctx.suite_id, "args": flow_args(ctx), **samples}
        (ctx.shared_dir / SHARED_FILE).write_text(json.dumps(shared, default=str))
    clean = samples["clean"]
    figures = [
        h.Figure(
            "overhead_pct",
            "orchestration overhead, % of the default run's wall time",
            "%",
            h.pluck(clean, "overhead_pct"),
            anchor=_ANCHOR,
            target=h.Target("<=", 10.0, "<= 10 %"),
        ),
        h.Figure(
            "overhead_s",
            "orchestration overhead, seconds",
            "s",
            h.pluck(clean, "overhead_s"),
            anchor=_ANCHOR,
        ),
        h.Figure("wall_s", "default `trainflow run` wall time", "s", h.pluck(clean, "wall_s")),
        *_other_arm_figures(samples),
        h.Figure(
            "prefect_start_s",
            "Prefect temporary server + flow-run start",
            "s",
            h.pluck(clean, "prefect_start_s"),
        ),
        h.Figure(
            "non_library_pct",
            "wall time outside the ML library calls, %",
            "%",
            h.pluck(clean, "non_library_pct"),
            anchor="data.preprocess, run_sweep, train_final, evaluate_state, registration",
        ),
        h.Figure(
            "ray_start_s",
            "Ray local instance start (inside the preprocess task)",
            "s",
            h.pluck(clean, "ray_start_s"),
        ),
    ]
    for stage in STAGES:
        overheads = [
            a["stage_seconds"][stage]
            - next(p["work_s"] for p in a["parts"] if p["part"] == f"stage {stage}")
            for a in clean
            if stage in a["stage_seconds"]
        ]
        figures.append(
            h.Figure(
                f"stage_overhead_{stage}_s",
                f"Prefect overhead of stage {stage}",
                "s",
                overheads,
                anchor="the stage's task bodies",
            )
        )
    return h.Outcome(
        figures=figures,
        samples={"clean": clean, "stack": samples["stack"]},
        params={
            "trainflow_args": flow_args(ctx) or "(none: the default configuration)",
            "reps": reps,
            "fresh_home_per_run": True,
            "shared_with_B7": with_recovery,
        },
        notes=[
            "overhead = process wall time - time inside the stage tasks' bodies; a stage body "
            "includes its MLflow logging and, for preprocess, the Ray start",
            "each clean run uses a fresh trainflow home: the Prefect and MLflow databases are "
            "created in the run, as in a first `make run`",
            "stack runs: one `trainflow up` (Prefect server + worker, MLflow server on free "
            "loopback ports) serves all of them, each with a fresh storage root; the stack's "
            "start is not counted",
        ],
        extra={
            "stage_table": stage_table(clean),
            "stage_table_stack": stage_table(samples["stack"]),
        },
    )
