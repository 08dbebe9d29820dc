"""A local Ray instance started in a thread while the CLI imports the pipeline.

Ray ties the instance's own processes (GCS, raylet, dashboard) to the *thread* that started them
(PR_SET_PDEATHSIG: they are killed when it ends; seen as "Failed to connect to GCS" a minute
later), so that thread waits until the instance is stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class EarlyStart:
    """One early start per process: ``begin`` runs ``start`` in a thread that then holds on;
    the caller's next connect ``adopt``s it; ``end`` lets the thread go once Ray is stopped."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._pending = False  # started, not yet adopted by a connect of the caller's
        self.done = threading.Event()  # the start is over, well or not
        self._release = threading.Event()  # Ray is stopped: the starting thread may end
        self._error: list[BaseException] = []

    @property
    def begun(self) -> bool:
        """A thread holds (or is starting) an instance."""
        return self._thread is not None

    @property
    def idle(self) -> bool:
        """No thread, nothing left to adopt."""
        return self._thread is None and not self._pending

    def begin(self, start: Callable[[], object]) -> None:
        """Run ``start`` in a thread that, once it is over, waits for ``end``."""
        self.done.clear()
        self._release.clear()
        self._error.clear()

        def start_and_hold() -> None:
            try:
                start()
            except BaseException as exc:  # noqa: BLE001 - raised again by adopt()
                self._error.append(exc)
            finally:
                self.done.set()
            self._release.wait()

        self._pending = True
        self._thread = threading.Thread(target=start_and_hold, name="ray-early-start", daemon=True)
        self._thread.start()

    def adopt(self, *, raise_error: bool = True) -> bool:
        """Wait for a start under way to end. True when it started an instance that this thread
        (the main one, where signal handlers belong) now owns; its error is raised (or, with
        ``raise_error`` False, dropped) otherwise."""
        if not self._pending or threading.current_thread() is self._thread:
            return False
        self.done.wait()
        self._pending = False
        if self._error:
            error = self._error.pop()
            self.end()
            if raise_error:
                raise error
            return False
        return True

    def end(self) -> None:
        """Let the thread that started the instance end (it is stopped, or never was)."""
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            self._release.set()
            thread.join()
