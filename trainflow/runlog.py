"""One log file per command run: everything the libraries print goes there, not to the console.

Ray, Tune, Train, Prefect and MLflow write to the process's stdout/stderr (and so do the
processes they start: Prefect's temporary server, Ray's log forwarding, C++ logs). ``CommandLog``
points file descriptors 1 and 2 at ``<home>/logs/<command>-<time>-<pid>.log`` for the duration
of a command and gives trainflow's own consoles the terminal; ``--verbose`` streams the file to
the terminal as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import typer

from trainflow import output
from training.errors import TrainflowError

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_TAIL_POLL_S = 0.2


class CommandLog:
    """A context manager: while inside, stdout/stderr of the process go to :attr:`path`."""

    def __init__(self, home: Path, command: str, verbose: bool = False) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.path = home / "logs" / f"{command}-{stamp}-{os.getpid()}.log"
        self.verbose = verbose
        self.interactive = False  # whether the console is a terminal (set on entry)
        self._saved: dict[int, int] = {}
        self._terminal: list[IO[str]] = []
        self._handler: logging.Handler | None = None
        self._tail: _Tail | None = None

    def __enter__(self) -> CommandLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.interactive = os.isatty(self._saved[1])
        log_fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        for fd in (1, 2):
            os.dup2(log_fd, fd)
        os.close(log_fd)
        self._terminal = [os.fdopen(os.dup(self._saved[fd]), "w", buffering=1) for fd in (1, 2)]
        output.attach(*self._terminal)
        # Our own loggers (progress events, stage details) into the file with timestamps.
        self._handler = logging.StreamHandler(sys.stderr)
        self._handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        ours = logging.getLogger("trainflow")
        ours.addHandler(self._handler)
        ours.setLevel(logging.INFO)
        if self.verbose:
            self._tail = _Tail(self.path, self._terminal[1])
            self._tail.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Stop following; the descriptors keep pointing at the log until the process ends:
        libraries print at exit too (Prefect stopping its temporary server, Ray's shutdown)."""
        unexpected = exc is not None and not isinstance(
            exc, TrainflowError | typer.Exit | KeyboardInterrupt | SystemExit
        )
        if unexpected:  # a bug: its traceback belongs in the log, where the console points
            traceback.print_exception(exc_type, exc, tb)
        sys.stdout.flush()
        sys.stderr.flush()
        if self._tail is not None:
            self._tail.stop()
        logging.getLogger("trainflow").removeHandler(self._handler)
        if unexpected:
            output.print_error(
                f"unexpected {type(exc).__name__}: {exc} — this is a bug in trainflow or a "
                f"library; the traceback is in {self.path}"
            )
            raise typer.Exit(output.FAILURE_EXIT) from None
        return False

    def restore(self) -> None:
        """Descriptors 1 and 2 back to where they pointed before (for callers that go on)."""
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved = {}
        output.detach()
        for stream in self._terminal:
            stream.close()


@contextlib.contextmanager
def logged_to_file(home: Path, command: str, verbose: bool = False) -> Iterator[CommandLog]:
    """A :class:`CommandLog` for a command that prints after its work (``predict``,
    ``evaluate``): the descriptors point back at the terminal when the block ends, so the
    command's result and any error message reach the console (and a test's runner)."""
    log = CommandLog(home, command, verbose)
    try:
        with log:
            yield log
    finally:
        log.restore()


class _Tail(threading.Thread):
    """Copies what is appended to a file to a stream until stopped (``--verbose``)."""

    def __init__(self, path: Path, stream: IO[str]) -> None:
        super().__init__(name="trainflow-log-tail", daemon=True)
        self._path, self._stream = path, stream
        self._stop = threading.Event()

    def run(self) -> None:
        with open(self._path, errors="replace") as source:
            while True:
                stopping = self._stop.is_set()
                chunk = source.read()
                if chunk:
                    self._stream.write(chunk)
                    self._stream.flush()
                elif stopping:
                    return
                else:
                    self._stop.wait(_TAIL_POLL_S)

    def stop(self) -> None:
        self._stop.set()
        self.join()
