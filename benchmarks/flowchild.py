"""``python -m benchmarks.flowchild --timings PATH -- run ...``: `trainflow` with stopwatches.

Runs the real CLI (``trainflow.cli.app``) in this process after wrapping, without changing
what they do, the functions whose time B4 separates from the orchestration:

- the flow call (``pipeline``) and, inside the flow body, its first call (MLflow set-up), the
  stages (``_run_stages``), the HTML report (``_publish_report``, where it exists) and its last
  call (the summary artifact): Prefect's start-up (temporary server, flow run) lies between the
  call and the body;
- each stage task's body (``Task.fn`` of ``tasks.stages``): Prefect's task machinery lies
  between the stage's wall time (the flow's ``StageClock``) and its body;
- inside the bodies (``training.stages``), the library calls (``preprocessing.preprocess``,
  ``run_sweep``, ``train_final``, ``evaluate_model``, model logging/registration), Ray
  start/stop and MLflow set-up.

Every wrapped call appends ``(start, end)`` wall-clock stamps; they are written to the timings
file when the CLI returns (a killed run writes nothing).
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

STARTED = time.time()


def _timed(spans: dict, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            spans[name].append((start, time.time()))

    return wrapper


def _wrap(
    owner, attr: str, spans: dict, name: str, missing: list[str], optional: bool = False
) -> None:
    """Replace ``owner.attr`` by a timed wrapper; note it (and change nothing) if it is gone."""
    fn = getattr(owner, attr, None)
    if not callable(fn):
        if not optional:
            missing.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}")
        return
    setattr(owner, attr, _timed(spans, name, fn))


def instrument(spans: dict) -> list[str]:
    """Wrap the functions named in the module docstring; return the names not found.

    Other code may have moved a function: that one is then not timed, and B4 falls back to
    coarser boundaries instead of failing the run.
    """
    from trainflow.env import prepare_environment

    prepare_environment()  # what `trainflow run` does before prefect is imported
    import flows.pipeline as pipeline_module
    import tasks.stages as stages
    from training.data import preprocess as preprocessing
    from training.platform import cluster
    from training.stages import evaluate as evaluate_stage
    from training.stages import sweep as sweep_stage
    from training.stages import train as train_stage
    from training.tracking import flavour, registry, runs, store

    missing: list[str] = []
    # The flow itself stays untouched (Prefect validates its parameters against ``flow.fn``'s
    # signature); its body is bracketed by the first MLflow set-up call and the last artifact.
    flow = pipeline_module.pipeline

    @functools.wraps(flow)
    def call_flow(*args, **kwargs):
        start = time.time()
        try:
            return flow(*args, **kwargs)
        finally:
            spans["flow_call"].append((start, time.time()))

    pipeline_module.pipeline = call_flow
    _wrap(pipeline_module, "_run_stages", spans, "flow:stages", missing)
    _wrap(pipeline_module, "create_markdown_artifact", spans, "flow:artifact", missing)
    # The run's HTML report, built by the flow after the last stage (where it exists).
    _wrap(pipeline_module, "_publish_report", spans, "flow:report", missing, optional=True)
    for name in ("inspect_data", "preprocess", "sweep", "train", "evaluate", "promote"):
        task = getattr(stages, name, None)
        if task is None or not hasattr(task, "fn"):
            missing.append(f"tasks.stages.{name}")
            continue
        _wrap(task, "fn", spans, f"task:{name}", missing)
    _wrap(preprocessing, "preprocess", spans, "lib:preprocess", missing)
    _wrap(sweep_stage, "run_sweep", spans, "lib:sweep", missing)
    _wrap(train_stage, "train_final", spans, "lib:train", missing)
    _wrap(evaluate_stage, "evaluate_model", spans, "lib:evaluate", missing)
    _wrap(flavour, "log_model", spans, "lib:promote", missing)
    _wrap(registry, "promote", spans, "lib:promote", missing)
    _wrap(runs.Tracker, "start_parent_run", spans, "mlflow:parent_run", missing)
    _wrap(cluster, "connect", spans, "ray:connect", missing)
    _wrap(cluster, "shutdown", spans, "ray:shutdown", missing)
    _wrap(store, "configure", spans, "mlflow:configure", missing)
    return missing


def main(argv: list[str]) -> int:
    if "--timings" not in argv or "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    timings = Path(argv[argv.index("--timings") + 1])
    cli_args = argv[argv.index("--") + 1 :]
    spans: dict[str, list] = defaultdict(list)
    marks = {"child_start": STARTED}
    code: int | str | None = 0
    missing: list[str] = []
    try:
        missing = instrument(spans)
        marks["instrumented"] = time.time()
        from trainflow.cli import app

        sys.argv = ["trainflow", *cli_args]
        try:
            app()
        except SystemExit as exc:
            code = exc.code
    finally:
        marks["cli_returned"] = time.time()
        doc = {"marks": marks, "spans": spans, "missing": missing, "exit_code": code}
        timings.write_text(json.dumps(doc))
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
