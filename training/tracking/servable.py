"""What a logged model carries besides trainflow's code: the state file as it is served (a
Hugging Face model's merged, without its optimizer) and a text model's tokenizer as a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def tokenizer_file(spec: dict[str, Any], tmp: str) -> dict[str, str]:
    """A text model's tokenizer as its own file beside the state (``tokenizer.json``, for
    ``tokenizers.Tokenizer.from_file``); the model itself reads the copy in its state."""
    tokens = spec.get("tokens")
    if not tokens:
        return {}
    os.makedirs(os.path.join(tmp, "tokenizer"), exist_ok=True)
    path = os.path.join(tmp, "tokenizer", "tokenizer.json")
    Path(path).write_text(tokens["tokenizer"])
    return {"tokenizer": path}


def servable_state_file(state_path: str, tmp: str) -> tuple[str, dict[str, Any]]:
    """(the state file the model carries, its model config). A Hugging Face model's checkpoint
    is rewritten without its optimizer, a LoRA adapter merged into the weights
    (``hf_model.servable_state``): the registered model needs no PEFT and no base model.
    The model config of a LightningModule's state (``train.engine: lightning``) says so under
    ``engine``: the served model imports Lightning to rebuild it."""
    import torch

    state = torch.load(state_path, map_location="cpu", weights_only=True)
    if state.get("engine") == "lightning":
        return state_path, {**state["model_config"], "engine": "lightning"}
    if state["model_config"].get("kind") != "hf":
        return state_path, state["model_config"]
    from training.model.hf_model import servable_state

    state = servable_state({k: v for k, v in state.items() if k != "optimizer"})
    os.makedirs(os.path.join(tmp, "servable"), exist_ok=True)
    path = os.path.join(tmp, "servable", "state.pt")  # the name the model's files use
    torch.save(state, path)
    return path, state["model_config"]
