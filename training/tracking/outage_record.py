"""The run's record of the tracking outages it met: what did not answer, from when to when, and
what waited. Each is a line in the run's log when it ends; once the server answers, the pipeline
writes them on its parent MLflow run (:func:`write`): the table ``outages.json`` (one row per
outage, appended to by a resume) and the tag ``trainflow.outages`` (how many in all).

A run that stopped because the server stayed away past the grace cannot write them: it keeps
them beside its checkpoints (:func:`keep_pending`), and its resume writes them once the server
answers (:func:`load_pending`). The outage that stopped it is a row too, ending when it stopped.

Who waits: a stage in ``training.stages.blips`` (:func:`watch` around its wait) and the final
training's epoch rows (:func:`watched`, around the train run's history sink). The record is the
process's: the flow and its stage tasks run in one process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from training.errors import TrackingUnavailableError
from training.platform.secrets import redact

TABLE = "outages.json"
COUNT_TAG = "trainflow.outages"
# "trainflow.*": the run's log file keeps this logger's lines (trainflow.runlog).
logger = logging.getLogger("trainflow.outages")

_lock = threading.Lock()
_outages: list[Outage] = []
_written = 0  # how many of _outages are on the parent run already
# Server URI -> when a send of the epoch rows first failed, while it still does: the outage
# began then, not when a stage starts waiting for the server.
_gone_since: dict[str, float] = {}


@dataclass(frozen=True)
class Outage:
    what: str  # "MLflow at <URL>", credentials redacted
    started: str  # UTC, ISO 8601
    ended: str
    seconds: float
    waited: str  # the stage, or the training's epoch rows


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def ended(uri: str, since: float, waited: str, now: float | None = None) -> Outage:
    """Record an outage of the server at ``uri`` from ``since`` (``time.time()``) to ``now``."""
    now = time.time() if now is None else now
    outage = Outage(
        what=f"MLflow at {redact(uri)}",
        started=_iso(since),
        ended=_iso(now),
        seconds=round(now - since, 1),
        waited=waited,
    )
    with _lock:
        _outages.append(outage)
    logger.warning(
        "tracking outage: %s did not answer from %s to %s (%.0f s); waited: %s",
        outage.what,
        outage.started,
        outage.ended,
        outage.seconds,
        waited,
    )
    return outage


def recorded() -> list[Outage]:
    with _lock:
        return list(_outages)


@contextlib.contextmanager
def watch(uri: str, waited: str) -> Iterator[None]:
    """Around a wait for the server: recorded when the wait ends, or when it gave up (past the
    grace: the run stops)."""
    with _lock:
        since = min(time.time(), _gone_since.get(uri, float("inf")))
    try:
        yield
    except BaseException as exc:
        why = "the server did not answer within the grace"
        if not isinstance(exc, TrackingUnavailableError):  # Ctrl-C, SIGTERM while waiting
            why = type(exc).__name__
        ended(uri, since, f"{waited}, stopped ({why})")
        raise
    ended(uri, since, waited)


def watched(sink: Callable[[list[dict[str, Any]]], None], uri: str, waited: str):
    """``sink`` (rows of epochs), recording the outage its failures span: from the first send
    the server did not answer to the next that reached it."""
    from training.tracking.outage import is_server_gone

    held: list[Any] = []  # the first epoch that waited; empty while the server answers

    def send(rows: list[dict[str, Any]]) -> None:
        try:
            sink(rows)
        except Exception as exc:
            if is_server_gone(exc) and not held:
                held.append(rows[0].get("epoch") if rows else None)
                with _lock:
                    _gone_since.setdefault(uri, time.time())
            raise
        if held:
            with _lock:
                since = _gone_since.pop(uri, time.time())
            last = rows[-1].get("epoch") if rows else None
            ended(uri, since, f"{waited} (epochs {held.pop()}-{last})")

    return send


def write(client, parent_run: str) -> int:
    """The outages not yet on ``parent_run``, appended to its table and counted in its tag;
    how many were written. Called once the server answers (a failure leaves them for later)."""
    global _written
    with _lock:
        new = _outages[_written:]
    if not new:
        return 0
    before = int(client.get_run(parent_run).data.tags.get(COUNT_TAG, "0") or 0)
    rows = [asdict(o) for o in new]
    client.log_table(parent_run, {k: [r[k] for r in rows] for k in rows[0]}, TABLE)
    client.set_tag(parent_run, COUNT_TAG, str(before + len(new)))
    with _lock:
        _written += len(new)
    return len(new)


def keep_pending(uri: str, endpoint_url: str | None = None) -> None:
    """The outages not on the parent run yet, saved at ``uri`` for the resume (an empty list
    once they are written, if an earlier run left some)."""
    from training.storage import exists, write_text_atomic

    with _lock:
        rows = [asdict(o) for o in _outages[_written:]]
    if rows or exists(uri, endpoint_url):
        write_text_atomic(uri, json.dumps(rows, indent=1), endpoint_url)


def load_pending(uri: str, endpoint_url: str | None = None) -> int:
    """The outages an earlier, stopped run of the same id kept at ``uri``, back in the record
    (not yet written); how many."""
    from training.storage import exists, read_text

    if not exists(uri, endpoint_url):
        return 0
    kept = [Outage(**row) for row in json.loads(read_text(uri, endpoint_url) or "[]")]
    with _lock:
        _outages.extend(kept)
    return len(kept)


def reset() -> None:
    """Forget the record (tests; a process that runs the pipeline again)."""
    global _written
    with _lock:
        _outages.clear()
        _gone_since.clear()
        _written = 0
