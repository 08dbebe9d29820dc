"""``train.profile: {steps: N}``: rank 0 of the final training records N optimizer steps with
``torch.profiler`` (after one skipped and one warm-up step, the profiler's own schedule: the
first steps pay for lazy set-ups that are no part of a step).

The worker keeps the Chrome trace (gzipped when large) and a table of the top operators by self
CPU time; they travel to the driver in the worker's return value (as the history does) and the
train stage logs them to its MLflow run (``log_profile``): ``profile/trace.json`` (or
``.json.gz``, which Perfetto and chrome://tracing open as is) and the table
``profile/top_ops.json``.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from typing import Any

TRACE_DIR = "profile"
TOP_OPS_FILE = "profile/top_ops.json"
GZIP_ABOVE_BYTES = 5 * 1024**2
TOP_OPS = 20
SKIPPED_STEPS, WARMUP_STEPS = 1, 1


class StepProfiler:
    """``torch.profiler`` over the loop's optimizer steps; ``step()`` after each one."""

    def __init__(self, steps: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.result: dict[str, Any] | None = None
        self._profile = profile(
            activities=activities,
            schedule=schedule(wait=SKIPPED_STEPS, warmup=WARMUP_STEPS, active=steps, repeat=1),
            on_trace_ready=self._keep,
        )
        self._profile.start()

    def step(self) -> None:
        if self._profile is None:
            return
        self._profile.step()
        if self.result is not None:  # the recorded steps are done: no more overhead
            self._stop()

    def finish(self) -> dict[str, Any] | None:
        """The trace and table (None if training ended before the first recorded step); a run
        shorter than its steps keeps the steps it recorded."""
        self._stop()
        return self.result

    def _stop(self) -> None:
        if self._profile is not None:
            profiler, self._profile = self._profile, None
            profiler.stop()

    def _keep(self, profiler) -> None:
        with tempfile.TemporaryDirectory(prefix="trainflow-profile-") as tmp:
            path = os.path.join(tmp, "trace.json")
            profiler.export_chrome_trace(path)
            with open(path, "rb") as handle:
                trace = handle.read()
        name = "trace.json"
        if len(trace) > GZIP_ABOVE_BYTES:
            trace, name = gzip.compress(trace), "trace.json.gz"
        self.result = {"trace_name": name, "trace": trace, "top_ops": top_ops(profiler)}


def top_ops(profiler, limit: int = TOP_OPS) -> dict[str, list]:
    """The operators with the most self CPU time, as columns (``mlflow.log_table``'s form)."""
    # ProfilerStep#N spans a whole step: a frame, not an operator.
    ops = [e for e in profiler.key_averages() if not e.key.startswith("ProfilerStep")]
    events = sorted(ops, key=lambda event: event.self_cpu_time_total, reverse=True)[:limit]
    table: dict[str, list] = {
        "operator": [event.key for event in events],
        "calls": [int(event.count) for event in events],
        "self_cpu_ms": [event.self_cpu_time_total / 1000 for event in events],
        "cpu_total_ms": [event.cpu_time_total / 1000 for event in events],
    }
    if any(getattr(event, "self_device_time_total", 0) for event in events):
        table["self_device_ms"] = [event.self_device_time_total / 1000 for event in events]
    return table


def profiler_for(steps: int, rank: int) -> StepProfiler | None:
    """Rank 0's profiler when ``steps`` > 0; None elsewhere."""
    return StepProfiler(steps) if steps and rank == 0 else None


def log_profile(tracker, run_id: str, profile: dict[str, Any] | None) -> None:
    """The worker's trace and top-operator table, as artifacts of ``run_id``."""
    if not profile:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, profile["trace_name"])
        with open(path, "wb") as handle:
            handle.write(profile["trace"])
        tracker.log_artifact(run_id, path, TRACE_DIR)
    tracker.client.log_table(run_id, data=profile["top_ops"], artifact_file=TOP_OPS_FILE)
