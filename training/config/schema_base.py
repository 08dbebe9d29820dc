"""What every section of the schema shares: refusing unknown keys, the built-in data set."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

BUILTIN_DIGITS = "builtin:digits"
DIGITS_IMAGE_SHAPE = [1, 8, 8]


class Section(BaseModel):
    # Unknown keys are typos: refuse them instead of silently ignoring them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
