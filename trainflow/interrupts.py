"""How ``trainflow run`` ends when a signal or a failure of the system stops it.

Ctrl-C exits 130 and SIGTERM 143 whenever they come, even after the flow returned: the signal
is read from the record ``training.platform.signals`` keeps, because the exception a handler
raises can be lost on its way (Python drops one raised inside a garbage-collector callback).
Either way, and for a failure that a resume can help (exit 1, not bad input), the console
names the resume command.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import typer

from trainflow import output
from training.errors import TrainflowError
from training.platform import signals

SIGINT_EXIT = 128 + signal.SIGINT
SIGTERM_EXIT = 128 + signal.SIGTERM

_run_id: list[str] = []  # the run this process runs, for a signal that comes as it exits


def resume_hint(run_id: str | None) -> str:
    return f"; resume with `trainflow run --resume {run_id}`" if run_id else ""


def interrupt_code(exc: BaseException | None = None) -> int | None:
    """130 for Ctrl-C, 143 for SIGTERM, None when no signal stopped the run.

    The exception tells when it is a KeyboardInterrupt or Prefect's TerminationSignal; inside
    Ray calls a signal arrives as a plain SystemExit, and the record tells them apart.
    """
    received = signals.received()
    if isinstance(exc, KeyboardInterrupt) or received == signal.SIGINT:
        return SIGINT_EXIT
    if received == signal.SIGTERM or (exc is not None and _is_termination(exc)):
        return SIGTERM_EXIT
    return None


def _is_termination(exc: BaseException) -> bool:
    from prefect.exceptions import TerminationSignal

    return isinstance(exc, TerminationSignal)


def report(code: int, run_id: str | None, *, ended: bool) -> None:
    """The one line an interrupted run ends with."""
    what = "interrupted" if code == SIGINT_EXIT else "terminated (SIGTERM)"
    runs = "the run had ended, its MLflow runs closed" if ended else "MLflow runs marked KILLED"
    line = f"[bold red]{what}[/]: {runs}{resume_hint(run_id)}"
    output.errors.print(line, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def reported(run_id: str | None) -> Iterator[None]:
    """The whole of a run, from its start to the summary's last line."""
    _run_id[:] = [run_id] if run_id else []
    try:
        yield
    except TrainflowError as exc:
        # Reported by the app's error handler, even after a signal; a failure of the system
        # (a worker lost for good, a full disk) gets the command that continues the run.
        if exc.user_error or not run_id or "--resume" in str(exc):
            raise
        output.print_error(f"{exc}{resume_hint(run_id)}")
        raise typer.Exit(output.FAILURE_EXIT) from None
    except BaseException as exc:
        code = interrupt_code(exc)
        if code is None:
            raise
        report(code, run_id, ended=False)
        raise typer.Exit(code) from None
    code = interrupt_code()
    if code is not None:  # the flow returned, yet a signal came: its exception was lost
        report(code, run_id, ended=True)
        raise typer.Exit(code)


def exit_code(code: int) -> int:
    """The process's exit code, given the command's: a signal that came while the process
    was ending (Prefect's queues drained, its temporary server stopped) makes it 130/143."""
    interrupted = interrupt_code() if code == 0 else None
    if interrupted is None:
        return code
    report(interrupted, _run_id[0] if _run_id else None, ended=True)
    return interrupted
