"""The sweep's search space: one hyperparameter's domain, and the check that every value a domain
can produce makes a valid config. The default space lives with the other defaults (config.py)."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from training.config.dotted import get_dotted, set_dotted

_DOMAIN_KINDS = ("loguniform", "uniform", "choice", "randint")
# Sections a sweep may not vary: the data, where things run and are stored, the sweep itself.
_NOT_SWEPT = ("sweep.", "mlflow.", "ray.", "storage.", "data.")


class SearchDomain(BaseModel):
    """One hyperparameter's distribution: exactly one of the four keys."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    loguniform: tuple[float, float] | None = None
    uniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SearchDomain:
        given = [k for k in _DOMAIN_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(_DOMAIN_KINDS)}")
        if self.loguniform is not None and not 0 < self.loguniform[0] < self.loguniform[1]:
            raise ValueError("loguniform needs 0 < low < high")
        if self.uniform is not None and not self.uniform[0] < self.uniform[1]:
            raise ValueError("uniform needs low < high")
        if self.randint is not None and not self.randint[0] < self.randint[1]:
            raise ValueError("randint needs low < high (high exclusive)")
        if self.choice is not None and len(self.choice) == 0:
            raise ValueError("choice needs at least one value")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in _DOMAIN_KINDS if getattr(self, k) is not None)

    def probe_values(self) -> list[Any]:
        """Values the domain can produce, to check against the config schema: the edges, and for
        continuous domains an interior non-integer point (a uniform range on an int key fails)."""
        if self.choice is not None:
            return list(self.choice)
        if self.randint is not None:
            return [self.randint[0], self.randint[1] - 1]
        low, high = getattr(self, self.kind)
        return [low, high, low + (high - low) * 0.37]


def check_search_key(config: BaseModel, key: str, domain: SearchDomain) -> None:
    """ValueError unless ``key`` is a sweepable key of ``config`` and every probe value of
    ``domain`` validates there (the config's own class validates each trial)."""
    if key.startswith(_NOT_SWEPT):
        raise ValueError(f"sweep.search_space key {key!r}: only train.* and model.* can be swept")
    raw = config.model_dump(mode="json")
    try:
        get_dotted(raw, key)
    except KeyError:
        # A custom factory's keyword argument need not be in model.params: its default is.
        if not _is_factory_param(raw, key):
            raise ValueError(
                f"sweep.search_space key {key!r} is not a config key; use dotted paths such as "
                "train.lr or model.dropout"
            ) from None
    for value in domain.probe_values():
        trial = copy.deepcopy(raw)
        trial["sweep"]["search_space"] = {}
        set_dotted(trial, key, value)
        try:
            type(config).model_validate(trial)
        except ValidationError as exc:
            first = exc.errors()[0]["msg"]
            raise ValueError(
                f"sweep.search_space[{key!r}] can produce {value!r}, which is invalid: {first}"
            ) from None


def _is_factory_param(raw: dict[str, Any], key: str) -> bool:
    """``model.params.<name>`` of a custom model (one level: a keyword of its factory)."""
    parts = key.split(".")
    model = raw.get("model", {})
    return len(parts) == 3 and parts[:2] == ["model", "params"] and model.get("kind") == "custom"
