"""training.platform.signals: a SIGINT/SIGTERM that a library handler swallowed still stops the run.

Each case runs in its own interpreter: the wakeup fd and the handlers are process-wide.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Like Ray Train's fit(): its own SIGINT handler replaces ours, aborts, and may simply return.
SCRIPT = """
import os, signal
from training.platform import signals
signals.watch()
signal.signal(signal.SIG{name}, lambda number, frame: None)
{send}
signals.stop_if_received()
print("went on")
"""


def _run(name: str, send: bool) -> subprocess.CompletedProcess:
    code = SCRIPT.format(
        name=name, send=f"os.kill(os.getpid(), signal.SIG{name})" if send else "pass"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(("name", "codes"), [("INT", (130, -2)), ("TERM", (143,))])
def test_a_swallowed_signal_stops_the_process(name, codes):
    done = _run(name, send=True)
    assert done.returncode in codes, done.stderr
    assert "went on" not in done.stdout


def test_no_signal_goes_on():
    done = _run("INT", send=False)
    assert done.returncode == 0, done.stderr
    assert "went on" in done.stdout


# After fit(): Ray Train leaves its SIGINT handler in place; a Ctrl-C during evaluation must
# still interrupt (KeyboardInterrupt from Python's handler, under ours), not be swallowed.
AFTER_FIT = """
import os, signal
from training.platform import signals
signal.signal(signal.SIGINT, signal.default_int_handler)  # as the CLI has it (xdist ignores it)
signals.watch()
with signals.handlers_restored():
    signal.signal(signal.SIGINT, lambda number, frame: None)  # fit()'s handler
try:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while evaluating
    import time; time.sleep(1)
    print("went on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_ctrl_c_after_fit_is_not_swallowed_by_its_handler():
    done = subprocess.run(
        [sys.executable, "-c", AFTER_FIT], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert "interrupted" in done.stdout, (done.stdout, done.stderr)
    assert "went on" not in done.stdout


# During fit(): Prefect's task handler for SIGTERM raises an exception that Ray's wait drops;
# inside the block a SIGTERM asks Ray Train's controller to abort (its Ctrl-C handler, which
# fit() installs), and a second one, or one outside Train's window, exits at once.
DURING_FIT = """
import os, signal, time
from training.platform import signals

class TerminationSignal(BaseException): pass

def prefects(number, frame): raise TerminationSignal
signal.signal(signal.SIGTERM, prefects)
with signals.sigterm_stops_ray_calls():
    if {train_window}:
        signal.signal(signal.SIGINT, lambda number, frame: print("abort asked", flush=True))
    for _ in range({signals}):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
    print("fit returned", flush=True)
print("prefect's handler back:", signal.getsignal(signal.SIGTERM) is prefects)
"""


def _during_fit(train_window: bool, signals: int) -> subprocess.CompletedProcess:
    code = DURING_FIT.format(train_window=train_window, signals=signals)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )


def test_a_sigterm_during_fit_asks_train_to_abort_and_fit_returns():
    done = _during_fit(train_window=True, signals=1)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "abort asked",
        "fit returned",
        "prefect's handler back: True",
    ]


@pytest.mark.parametrize(("train_window", "signals"), [(True, 2), (False, 1)])
def test_a_second_sigterm_or_one_outside_trains_window_exits_at_once(train_window, signals):
    done = _during_fit(train_window=train_window, signals=signals)
    assert done.returncode == 143, (done.stdout, done.stderr)
    assert "fit returned" not in done.stdout
    assert done.stdout.count("abort asked") == (1 if train_window else 0)


# The handler's exception lost: raised inside a finaliser (as in a weakref callback during
# garbage collection, seen after training), Python prints "Exception ignored" and goes on; and
# another library took the wakeup fd. The handler's own record still stops the run.
LOST = """
import os, signal
from training.platform import signals
signal.signal(signal.SIGINT, signal.default_int_handler)
signals.watch()
signal.set_wakeup_fd(-1)

class Finalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs here
            pass

Finalised()
print("went on", flush=True)
signals.stop_if_received()
print("not stopped")
"""


def test_a_signal_whose_exception_was_lost_is_still_recorded():
    done = subprocess.run(
        [sys.executable, "-c", LOST], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert "Exception ignored" in done.stderr and "KeyboardInterrupt" in done.stderr
    assert done.stdout.splitlines() == ["went on"], (done.stdout, done.stderr)
    assert done.returncode in (130, -2)


# A second signal during the first one's clean-up ends the process at once. The first reaches
# the run through our handler, or through another's (Ray Train's abort in fit()) and the record.
SECOND = """
import os, signal, subprocess, time
from training.platform import signals
child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
signals.watch()
signals.watch()  # Ray started again in this process: still one handler of ours
try:
    if {by_train}:
        with signals.handlers_restored():
            signal.signal(signal.SIG{name}, lambda number, frame: None)
            os.kill(os.getpid(), signal.SIG{name})
        signals.stop_if_received()
    else:
        os.kill(os.getpid(), signal.SIG{name})
        time.sleep(5)
except BaseException as exc:
    print("cleaning up after", type(exc).__name__, flush=True)
    os.kill(os.getpid(), signal.SIG{name})
    time.sleep(5)
    print("clean-up finished")
"""


@pytest.mark.parametrize("by_train", [False, True])
@pytest.mark.parametrize(("name", "first"), [("INT", "KeyboardInterrupt"), ("TERM", "SystemExit")])
def test_a_second_signal_during_the_clean_up_stops_at_once(name, first, by_train):
    code = SECOND.format(name=name, by_train=by_train)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    child, *said = done.stdout.splitlines()
    assert said == [f"cleaning up after {first}"], (done.stdout, done.stderr)
    assert done.returncode == -getattr(signal, f"SIG{name}")
    deadline = time.monotonic() + 10
    while _alive(int(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(int(child)), "the child outlived the stop"


def _alive(pid: int) -> bool:
    """Running, not a zombie awaiting its reaper (init, once its parent died)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
