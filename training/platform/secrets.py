"""Keeping credentials out of everything trainflow writes: URIs shown, tags, logs, messages."""

from __future__ import annotations

import re
from typing import Any

# ``user:password@`` in any URI of a text.
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str) -> str:
    """Hide ``user:password@`` in every URI inside ``text``."""
    return _USERINFO.sub("***@", text)


def redact_tree(value: Any) -> Any:
    """:func:`redact` applied to every string of a nested dict/list."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value


def without_userinfo(uri: str) -> str:
    """A URL to show (and click): credentials dropped, not masked."""
    return _USERINFO.sub("", uri)
