"""Progress events, the progress view, Prefect's traceback filter, the run log."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rich.console import Console

from flows.quiet_errors import DropTracebackOfOurErrors
from trainflow.progress_view import ProgressView
from training import progress
from training.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _view(live: bool = False, every: float = 30.0) -> tuple[ProgressView, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=live, color_system=None)
    return ProgressView(console, live=live, plain_every_s=every), out


def test_a_progress_event_carries_its_fields_and_other_records_none(caplog):
    with caplog.at_level(logging.INFO, logger=progress.LOGGER):
        progress.report("sweep", "3/8 trials", finished=3, total=8)
    (record,) = caplog.records
    assert record.getMessage() == "sweep: 3/8 trials"
    assert progress.fields_of(record) == {"stage": "sweep", "finished": 3, "total": 8}
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "plain", None, None)
    assert progress.fields_of(plain) is None


def test_every_is_due_once_per_period(monkeypatch):
    now = [100.0]
    every = progress.Every(10)
    every._clock = lambda: now[0]
    assert every.due()
    now[0] = 105.0
    assert not every.due()
    now[0] = 110.0
    assert every.due()


def test_plain_view_prints_a_stage_when_it_ends_not_each_event():
    view, out = _view(live=False, every=3600)
    with view:
        progress.report("preprocess", "start", event="start")
        for n in range(50):
            progress.report("preprocess", f"{n} rows read")
        progress.report("preprocess", "done", event="done", seconds=1.25)
        progress.report("not-a-stage", "ignored")
    lines = out.getvalue().splitlines()
    assert lines == ["[1/5] preprocess: 49 rows read · done in 1.2 s"]


def test_plain_view_prints_a_long_stage_at_its_rate():
    view, out = _view(live=False, every=0)
    with view:
        progress.report("train", "start", event="start")
        progress.report("train", "epoch 1/3")
        progress.report("train", "epoch 2/3")
    assert out.getvalue().splitlines() == ["[3/5] train: epoch 1/3", "[3/5] train: epoch 2/3"]


def test_the_view_stops_listening_when_it_exits():
    view, out = _view(live=False, every=0)
    with view:
        pass
    progress.report("train", "start", event="start")
    progress.report("train", "epoch 1/3")
    assert out.getvalue() == ""


def test_live_view_draws_every_stage_with_its_state():
    view, out = _view(live=True)
    with view:
        progress.report("preprocess", "start", event="start")
        progress.report("preprocess", "1,797 rows written")
        progress.report("preprocess", "done", event="done", seconds=2.0)
        progress.report("sweep", "start", event="start")
    text = out.getvalue()
    assert "1/5 preprocess" in text and "1,797 rows written · 2.0 s" in text
    assert "✓" in text and "2/5 sweep" in text and "5/5 promote" in text


def _record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:
        return logging.LogRecord(
            "prefect.task_runs", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()
        )


def test_our_errors_lose_their_traceback_in_prefects_logs_and_bugs_keep_it():
    drop = DropTracebackOfOurErrors()
    ours = _record(ConfigError("sweep.trials must be >= 1"))
    assert drop.filter(ours) and ours.exc_info is None
    bug = _record(ValueError("a bug"))
    assert drop.filter(bug) and bug.exc_info is not None


def _run_in_command_log(tmp_path, body: str) -> subprocess.CompletedProcess:
    """CommandLog moves file descriptors 1 and 2: run it in a process of its own."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from trainflow import output
        from trainflow.runlog import CommandLog

        with CommandLog(Path({str(tmp_path)!r}), "run") as log:
            print("library noise on stdout")
            os.write(2, b"C-level noise on fd 2\\n")
            output.console.print("for the user")
            {body}
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


def test_command_log_keeps_library_output_off_the_console(tmp_path):
    proc = _run_in_command_log(tmp_path, "pass")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "for the user\n" and proc.stderr == ""
    (log,) = (tmp_path / "logs").glob("run-*.log")
    text = log.read_text()
    assert "library noise on stdout" in text and "C-level noise on fd 2" in text
    assert "for the user" not in text
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_a_bug_leaves_its_traceback_in_the_log_and_the_console_says_where(tmp_path):
    proc = _run_in_command_log(tmp_path, "raise KeyError('oops')")
    assert proc.returncode == 1
    (log,) = (tmp_path / "logs").glob("run-*.log")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "unexpected KeyError" in proc.stderr and str(log) in proc.stderr
    assert "Traceback" in log.read_text() and "oops" in log.read_text()


class _Trial:
    def __init__(self, trial_id: str, status: str = "RUNNING", epochs: int = 0):
        self.trial_id, self.status = trial_id, status
        self.last_result = {"training_iteration": epochs}


def test_sweep_progress_ranks_trials_by_their_latest_value_as_the_outcome_does(caplog):
    from training.tune.progress import SweepProgress

    sweep = SweepProgress("val_accuracy", "max", num_samples=2, max_t=3)
    first, second = _Trial("abc_00000"), _Trial("abc_00001")
    trials = [first, second]
    with caplog.at_level(logging.INFO, logger=progress.LOGGER):
        sweep.on_trial_result(1, trials, first, {"val_accuracy": 0.9})
        sweep.on_trial_result(1, trials, second, {"val_accuracy": 0.7})
        assert (sweep.best, sweep.best_trial) == (0.9, "trial 00")
        sweep.on_trial_result(2, trials, first, {"val_accuracy": 0.5})  # trial 00 got worse
        assert (sweep.best, sweep.best_trial) == (0.7, "trial 01")
        sweep.on_trial_result(2, trials, second, {"val_accuracy": float("nan")})  # ignored
        first.last_result, first.status = {"training_iteration": 1}, "TERMINATED"
        sweep.on_trial_complete(2, trials, first)
    last = caplog.records[-1].getMessage()
    assert "1/2 trials done (1 stopped early, 0 errored), 1 running" in last
    assert "best val_accuracy 0.7000 (trial 01)" in last


def test_trainflow_run_prints_the_log_files_path_first(tmp_path):
    """`trainflow run --config configs/lm.yaml` up to the run itself: the config, the driver's
    check of its Hugging Face model (transformers resolves the architecture) and the log file.
    Nothing a library prints may come before the line naming the log file; the pipeline is
    replaced by an exit (Ray, Prefect and MLflow would start there)."""
    script = textwrap.dedent(
        """
        import sys
        import typer
        from trainflow import cli

        def the_pipeline(config, run_id):
            raise typer.Exit(0)

        cli._run_pipeline = the_pipeline
        sys.argv = ["trainflow", "run", "--config", "configs/lm.yaml"]
        cli.main()
        """
    )
    env = {**os.environ, "TRAINFLOW_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the order the user sees
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines and lines[0].startswith("trainflow run: libraries log to "), proc.stdout
