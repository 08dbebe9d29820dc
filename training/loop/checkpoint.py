"""A checkpoint's state on disk: one ``state.pt`` per checkpoint directory, loaded safely.

Every path that reads a checkpoint (loop resume, evaluate, predict, promote) comes here.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

from training.errors import ModelNotFoundError, UnsafeCheckpointError, one_line

STATE_FILE = "state.pt"


def save_state(state: dict[str, Any], directory: str) -> str:
    """Write ``state`` as the checkpoint in ``directory``; returns the file's path."""
    path = os.path.join(directory, STATE_FILE)
    torch.save(state, path)
    return path


def load_state(directory: str) -> dict[str, Any]:
    """Load a checkpoint's state; ``weights_only=True`` refuses pickles that would run code."""
    path = os.path.join(directory, STATE_FILE)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = one_line(exc, limit=201) if str(exc).strip() else "unpickling refused"
        raise UnsafeCheckpointError(
            f"refused to load {path}: it holds objects other than tensors and plain data, so "
            f"loading it could run code ({reason}); use a checkpoint written by trainflow"
        ) from None


def load_model_state(path: str) -> dict[str, Any]:
    """A trainflow checkpoint (a directory holding state.pt, or the file itself)."""
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    if not os.path.isfile(os.path.join(directory, STATE_FILE)):
        raise ModelNotFoundError(f"no {STATE_FILE} at {path}; pass a trainflow checkpoint")
    return load_state(directory)
