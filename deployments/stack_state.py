"""The record of the running local stack: ``<home>/stack/state.json``.

`up` writes it as it starts each part; `down` and `status` read only it, and the CLI reads the
servers' URLs from it while every part it names still runs (see trainflow/env.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deployments.processes import Part
from training.errors import TrainflowError
from training.storage import atomic_path, trainflow_home


class StackError(TrainflowError):
    """The local stack cannot be started, found or stopped as asked."""


@dataclass
class StackState:
    """What `up` started; the single source of truth for `down` and `status`."""

    home: str
    pool: str
    prefect_url: str
    mlflow_url: str
    artifacts_destination: str
    parts: dict[str, Part] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    host: str = "127.0.0.1"  # what the servers listen on (the URLs are where clients go)

    @property
    def prefect_api_url(self) -> str:
        return f"{self.prefect_url}/api"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> StackState:
        raw = json.loads(text)
        parts = {name: Part(**part) for name, part in raw.pop("parts").items()}
        return cls(**raw, parts=parts)


def stack_dir(home: Path | None = None) -> Path:
    return (home or trainflow_home()) / "stack"


def state_path(home: Path | None = None) -> Path:
    return stack_dir(home) / "state.json"


def read_state(home: Path | None = None) -> StackState | None:
    path = state_path(home)
    if not path.is_file():
        return None
    try:
        return StackState.from_json(path.read_text())
    except (ValueError, TypeError, KeyError) as exc:
        raise StackError(
            f"the stack state file {path} is unreadable ({exc}); stop the processes it names by "
            "hand if any still run, then delete it"
        ) from None


def write_state(state: StackState) -> None:
    with atomic_path(state_path(Path(state.home))) as tmp:
        tmp.write_text(state.to_json())


def running_state(home: Path | None = None) -> StackState | None:
    """The recorded stack if every part of it still runs, else None (stale or absent)."""
    try:
        state = read_state(home)
    except StackError:
        return None
    if state is None or not state.parts:
        return None
    return state if all(part.is_running() for part in state.parts.values()) else None
