"""Telling an interruption apart: which SIGTERM/SIGINT this process got since Ray started in it.

Each signal becomes a different exception depending on who handles it (Prefect's flow engine,
Ray's driver handler, Ray Train's fit()), or into none at all: Python drops an exception a
handler raises inside a garbage-collector callback. The record kept here lets the flow and the
CLI stop and report an interruption (runs KILLED, exit 143/130) whatever became of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_WATCHED = (signal.SIGTERM, signal.SIGINT)
_OURS = "_trainflow_watch"  # marks the handler ``watch`` installs, so it never wraps itself
_received: list[int] = []  # signals this process got since Ray started in it


_wakeup: list[int] = []  # read end of the pipe Python writes each handled signal number to
_stopping: list[int] = []  # the signal whose stop began: a second one ends the process at once


def received() -> int | None:
    """SIGTERM or SIGINT, if this process got one since Ray started in it."""
    if _wakeup:
        with contextlib.suppress(BlockingIOError):
            _received.extend(n for n in os.read(_wakeup[0], 512) if n in _WATCHED)
    return _received[0] if _received else None


def stop_if_received() -> None:
    """Stop here if a SIGTERM/SIGINT arrived during a call that then returned normally (a Ray
    call, or one whose handler's exception Python dropped; the flow checks at every stage).

    Ray Train's fit() handles Ctrl-C itself: its handler aborts the run, and depending on
    where the controller was, fit() then returns the partial Result as if training had ended
    (seen with a 0.1 s controller poll). Without this check the flow would evaluate and
    register that half-trained model and exit 0.
    """
    number = received()
    if number is None:
        return
    _stopping.append(number)  # the clean-up begins: a second Ctrl-C may cut it short
    if number == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + number)


def _stop_now(number: int) -> None:
    """A second SIGINT/SIGTERM while the first one's clean-up runs: end the process at once,
    as the signal's default action does (the next resume marks runs left RUNNING as KILLED).

    The children hear a SIGTERM first: Ray's own processes die with their parent, but Prefect's
    temporary server, which an exit hook would have stopped, was left running.
    """
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.terminate()
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)  # not reached: the default action ends the process


@contextlib.contextmanager
def handlers_restored():
    """Put this process's SIGINT/SIGTERM handlers back after the block.

    Ray Train's fit() installs a Ctrl-C handler of its own and leaves it in place: a Ctrl-C
    after training (during evaluation) then only asked the finished controller to abort, and
    the run went on to register its model and exit 0.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in _WATCHED}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)


@contextlib.contextmanager
def sigterm_stops_ray_calls():
    """During a long Ray call of the main thread (a fit()): a SIGTERM stops it.

    Prefect's engine puts its own SIGTERM handler in place for each task, which raises
    TerminationSignal; Ray's wait for a result drops every exception of a handler but
    KeyboardInterrupt and SystemExit, so a run SIGTERMed at epoch 1 of 80 trained on to epoch 80
    before it stopped. Here the SIGTERM asks Ray Train's controller to abort, as its Ctrl-C
    handler does (fit() then returns and ``stop_if_received`` stops the run), or, outside
    Train's window or at a second SIGTERM, raises SystemExit at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigint_at_entry = signal.getsignal(signal.SIGINT)
    previous = signal.getsignal(signal.SIGTERM)
    asked: list[int] = []

    def on_sigterm(number, frame):
        train_abort = signal.getsignal(signal.SIGINT)  # Ray Train's, while fit() runs
        if not asked and callable(train_abort) and train_abort is not sigint_at_entry:
            asked.append(number)
            train_abort(signal.SIGINT, frame)
            return
        raise SystemExit(128 + number)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def watch() -> None:
    """Remember a SIGTERM/SIGINT, then let the handler in place act on it.

    Inside ``ray.get`` Ray turns the handler's exception (Ray's driver SIGTERM handler calls
    ``sys.exit``; SIGINT raises KeyboardInterrupt) into ``SystemExit(1)``, indistinguishable
    from any other exit, and Ray's native SIGTERM handler may abort the process; the record
    lets the flow and the CLI report an interruption (runs KILLED, exit 143/130) all the same.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if not _wakeup:
        # Ray Train's fit() later installs a SIGINT handler of its own (it aborts the run and
        # exits 0); Python's wakeup fd records every handled signal, whoever handles it.
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        _wakeup.append(read_end)
    for signum in _WATCHED:
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN or getattr(previous, _OURS, False):
            continue  # ignored on purpose, or watched already (Ray started again)

        def on_signal(number, frame, previous=previous):
            if _stopping:
                _stop_now(number)
            # Recorded here too: the exception below can be lost (raised inside a weakref
            # callback during garbage collection, Python prints "Exception ignored" and goes
            # on); the flow and the CLI then stop on the record (``stop_if_received``).
            _received.append(number)
            _stopping.append(number)
            if callable(previous):
                previous(number, frame)
            raise SystemExit(128 + number)

        setattr(on_signal, _OURS, True)
        signal.signal(signum, on_signal)
