"""What the CLI prints: results on stdout, errors on stderr, and the one error handler.

Every command runs inside ``reported_errors`` (through ``ReportingGroup``, the class of the
typer app): a TrainflowError ends the command with its message and an exit code, 2 when the
user can fix the cause (TrainflowError.user_error), 1 otherwise. Any other exception keeps its
traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from training.errors import TrainflowError

console = Console(stderr=False)
errors = Console(stderr=True)

# Errors the user can fix (``TrainflowError.user_error``: config, data, model, a server's address).
USER_ERROR_EXIT = 2
FAILURE_EXIT = 1


def attach(out, err) -> None:
    """Print to these streams (the terminal) while the process's own stdout/stderr go to a log."""
    console.file, errors.file = out, err


def detach() -> None:
    """Back to the process's stdout/stderr."""
    console.file = errors.file = None


def print_error(message: str) -> None:
    """``error: message`` on stderr, as written (no markup, long lines unbroken)."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def exit_code(exc: TrainflowError) -> int:
    return USER_ERROR_EXIT if exc.user_error else FAILURE_EXIT


@contextlib.contextmanager
def reported_errors() -> Iterator[None]:
    """Turn a TrainflowError into its message on stderr and the command's exit code."""
    try:
        yield
    except TrainflowError as exc:
        print_error(str(exc))
        raise typer.Exit(exit_code(exc)) from None


class ReportingGroup(TyperGroup):
    """The app's command group: every command (and sub-group) runs in ``reported_errors``."""

    def invoke(self, ctx: Any) -> Any:
        with reported_errors():
            return super().invoke(ctx)
