"""trainflow/interrupts.py: how `trainflow run` ends after Ctrl-C, SIGTERM or a failure of the
system, whatever exception (or none) carried the signal."""

from __future__ import annotations

import io
import signal

import pytest
import typer
from prefect.exceptions import TerminationSignal

from trainflow import interrupts, output
from training.errors import ConfigError, StorageError, TrackingUnavailableError
from training.platform import signals

RESUME = "trainflow run --resume r1"


@pytest.fixture
def console():
    out, err = io.StringIO(), io.StringIO()
    output.attach(out, err)
    yield err
    output.detach()


def _received(monkeypatch, number):
    monkeypatch.setattr(signals, "received", lambda: number)


def _ends(run_id="r1", raising: BaseException | None = None) -> int:
    with pytest.raises(typer.Exit) as exited, interrupts.reported(run_id):
        if raising is not None:
            raise raising
    return exited.value.exit_code


@pytest.mark.parametrize(
    ("number", "raising", "code"),
    [
        (None, KeyboardInterrupt(), 130),
        (None, TerminationSignal(signal.SIGTERM), 143),
        # Inside Ray calls a signal arrives as SystemExit(1): the record names it.
        (signal.SIGINT, SystemExit(1), 130),
        (signal.SIGTERM, SystemExit(1), 143),
    ],
)
def test_an_interrupted_run_exits_130_or_143_with_the_resume_command(
    monkeypatch, console, number, raising, code
):
    _received(monkeypatch, number)
    assert _ends(raising=raising) == code
    said = " ".join(console.getvalue().split())
    assert "MLflow runs marked KILLED" in said and RESUME in said


@pytest.mark.parametrize(("number", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_whose_exception_was_lost_still_fails_the_run(monkeypatch, console, number, code):
    # The flow returned normally (the handler's KeyboardInterrupt died in a GC callback).
    _received(monkeypatch, number)
    assert _ends() == code
    said = " ".join(console.getvalue().split())
    assert "the run had ended" in said and RESUME in said


def test_a_run_without_a_signal_ends_quietly(monkeypatch, console):
    _received(monkeypatch, None)
    with interrupts.reported("r1"):
        pass
    with pytest.raises(SystemExit), interrupts.reported("r1"):
        raise SystemExit(1)  # no signal: not an interruption, left as it is
    assert console.getvalue() == ""


def test_a_failure_of_the_system_names_the_resume_command(monkeypatch, console):
    _received(monkeypatch, None)
    assert _ends(raising=StorageError("the disk is full")) == output.FAILURE_EXIT
    assert "the disk is full; resume with `trainflow run --resume r1`" in console.getvalue()


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("train.lr must be > 0"),  # bad input: exit 2, a resume would not help
        TrackingUnavailableError("... resume the run (`trainflow run --resume r1`)"),
    ],
)
def test_bad_input_or_a_message_that_names_the_resume_is_left_as_it_is(monkeypatch, console, error):
    _received(monkeypatch, None)
    with pytest.raises(type(error)), interrupts.reported("r1"):
        raise error


def test_a_signal_while_the_process_exits_makes_the_exit_code(monkeypatch, console):
    _received(monkeypatch, None)
    with interrupts.reported("r1"):
        pass
    assert interrupts.exit_code(0) == 0
    _received(monkeypatch, signal.SIGINT)  # a Ctrl-C as Prefect's server stopped
    assert interrupts.exit_code(2) == 2  # the command's own failure stands
    assert interrupts.exit_code(0) == 130
    assert RESUME in " ".join(console.getvalue().split())
