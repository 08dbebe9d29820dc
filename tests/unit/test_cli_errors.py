"""The CLI's one error handler: exit 2 for the user's input, 1 for other failures of ours, and
a traceback for anything unexpected."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from trainflow.output import ReportingGroup
from training.errors import (
    ConfigError,
    DataValidationError,
    ServiceUnreachableError,
    TrainflowError,
)


def app_raising(exc: BaseException) -> typer.Typer:
    app = typer.Typer(cls=ReportingGroup, pretty_exceptions_enable=False)
    sub = typer.Typer()
    app.add_typer(sub, name="sub")

    @app.command()
    def boom() -> None:
        raise exc

    @sub.command("nested")
    def nested() -> None:  # a command of a sub-group is covered too
        raise exc

    return app


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("train.lr: must be > 0 [got -1]"), 2),
        (DataValidationError("label column 'species' is missing"), 2),
        (ServiceUnreachableError("Prefect API down"), 2),
        (TrainflowError("no MLflow store"), 1),
    ],
)
@pytest.mark.parametrize("command", [["boom"], ["sub", "nested"]])
def test_our_errors_exit_with_their_code_and_message(exc, code, command):
    result = CliRunner().invoke(app_raising(exc), command)
    assert result.exit_code == code
    assert f"error: {exc}" in result.output  # printed as written, markup-like text included
    assert "Traceback" not in result.output


def test_an_unexpected_error_keeps_its_traceback():
    result = CliRunner().invoke(app_raising(KeyError("bug")), ["boom"])
    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)


REPO_ROOT = Path(__file__).resolve().parents[2]


def _parquet(path: Path, **columns) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


# (the input, what the one message says): data.source refused before anything starts.
BAD_INPUTS = {
    "suffix": (lambda d: _write(d / "x.txt", "a,b\n1,2\n"), "cannot tell the format of"),
    "missing file": (lambda d: d / "nowhere.parquet", "does not exist; give an existing file"),
    "no label column": (
        lambda d: _parquet(d / "t.parquet", x=[1.0, 2.0], y=[0, 1]),
        "has no label column 'label'; its columns are ['x', 'y']. Set data.label_column",
    ),
    "label with gaps": (
        lambda d: _parquet(d / "t.parquet", x=[1.0, 2.0, 3.0], label=[0, None, 1]),
        "1 of 3 rows have no value in label column 'label' (the first in",
    ),
    "CSV label with gaps": (
        lambda d: _write(d / "t.csv", "x,label\n1.0,a\n2.0,\n3.0,b\n"),
        "1 of 3 rows have no value in label column 'label'",
    ),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_before_anything_starts(tmp_path, case):
    """`trainflow run` on bad local data: exit 2 with the message the flow would give, no
    traceback, within seconds (Ray, Prefect's server and MLflow take ~28 s to start), and
    nothing in the home: no Ray session, MLflow database or Prefect state."""
    make, message = BAD_INPUTS[case]
    source = make(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "TRAINFLOW_HOME": str(home)}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME"):
        env.pop(key, None)  # the developer's services are not this test's
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow", "run", "--set", f"data.source={source}"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - start
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert proc.stderr.startswith("error: ") and message in proc.stderr, text
    assert "Traceback" not in text
    assert list(home.iterdir()) == []
    assert took < 5, took
