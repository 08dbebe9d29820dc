"""Every move of the ``champion`` alias, recorded, listed and undone (rollback).

A move is one tag on the registered model, ``trainflow.champion_move.NNNNNN`` = JSON (when, by
whom, from which version to which, why, the metrics). Tags on the registered model rather than
on versions, because a move stays true after its versions are deleted, and one tag per move
rather than one growing list, because a tag holds at most 5,000 characters. Moves are written
only under the promotion lock, so their numbers never collide.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from typing import Any

from training.errors import TrainflowError
from training.gate import policy as gate
from training.tracking.lock import registry_lock

MOVE_PREFIX = "trainflow.champion_move."
CHAMPION = "champion"
ROLLBACK_TAGS = ("trainflow.rollback.when", "trainflow.rollback.by", "trainflow.rollback.why")


class RollbackRefused(TrainflowError):
    """The rollback's target is not a version that may hold the champion alias."""

    user_error = True


def who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in a bare container
        return "unknown"


def record_move(
    client, name: str, source: str | None, target: str, why: str, kind: str, metrics=None
) -> dict[str, Any]:
    """Add one move to the history (call it holding the promotion lock)."""
    moves = history(client, name)
    move = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "kind": kind,
        "from": source,
        "to": str(target),
        "why": why[:3000],
        "by": who(),
        "metrics": metrics or {},
    }
    key = f"{MOVE_PREFIX}{len(moves) + 1:06d}"
    client.set_registered_model_tag(name, key, json.dumps(move, sort_keys=True, default=str))
    return move


def history(client, name: str) -> list[dict[str, Any]]:
    """The champion's moves, oldest first."""
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(name).tags
    except MlflowException as exc:
        raise RollbackRefused(f"there is no registered model {name!r}") from exc
    keys = sorted(k for k in tags if k.startswith(MOVE_PREFIX))
    return [json.loads(tags[k]) for k in keys]


def _version(client, name: str, version: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException:
        return None


def _current(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def _previous(moves: list[dict], current) -> str | None:
    """The champion before the current one: the last move onto it came from there."""
    for move in reversed(moves):
        if move["to"] == str(current.version) and move.get("from"):
            return str(move["from"])
    previous = current.tags.get(gate.PREVIOUS_TAG)
    return None if previous in (None, "", "none") else previous


def _evaluated(tags: dict[str, str]) -> bool:
    return gate.METRIC_TAG in tags or any(k.startswith("test_") for k in tags)


def rollback(client, name: str, to: str | None = None, why: str = "") -> dict[str, Any]:
    """Move ``champion`` back to the previous champion (or version ``to``) under the promotion
    lock; the move is recorded and the target version tagged with who, when and why."""
    with registry_lock(client, name):
        moves = history(client, name)
        current = _current(client, name)
        if to is None:
            if current is None:
                raise RollbackRefused(f"{name} has no champion to roll back")
            to = _previous(moves, current)
            if to is None:
                raise RollbackRefused(
                    f"{name} version {current.version} had no champion before it; name the "
                    "version with --to"
                )
        target = _version(client, name, to)
        if target is None:
            raise RollbackRefused(f"{name} has no version {to!r}; see: trainflow history {name}")
        if not _evaluated(dict(target.tags)):
            raise RollbackRefused(
                f"{name} version {to} was never evaluated (no test metrics on it): it cannot "
                "hold the champion alias"
            )
        source = None if current is None else str(current.version)
        if source == str(to):
            raise RollbackRefused(f"{name} version {to} already is the champion")
        reason = why or f"rollback from version {source}"
        client.set_registered_model_alias(name, CHAMPION, str(to))
        move = record_move(client, name, source, str(to), reason, "rollback", _metrics(target))
        for key, value in zip(ROLLBACK_TAGS, (move["when"], move["by"], reason), strict=True):
            client.set_model_version_tag(name, str(to), key, value)
    return move


def _metrics(version) -> dict[str, str]:
    return {k: v for k, v in version.tags.items() if k.startswith("test_")}
