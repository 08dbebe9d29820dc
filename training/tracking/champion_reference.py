"""The champion's training reference (its spec's ``drift_reference``, plain data fitted with
it), read from the state file of the version that holds the champion alias."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import Any

from training.tracking import flavour, registry
from training.tracking.runs import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChampionReference:
    """The champion's version and its training reference ({}: it has none, e.g. an image
    model, or one trained before references were kept)."""

    version: str
    reference: dict[str, Any]


def champion_reference(tracker: Tracker, name: str) -> ChampionReference | None:
    """The current champion of ``name`` and its reference; None when there is no champion."""
    from training.loop.checkpoint import load_model_state

    champion = registry.current_champion(tracker, name)
    if champion is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        found = flavour.state_file(tracker, f"models:/{name}/{champion.version}", dst_path=tmp)
        spec = load_model_state(str(found))["spec"]
    return ChampionReference(champion.version, dict(spec.get("drift_reference") or {}))
