"""Config keys as dotted paths (``train.lr``): read, write and flatten nested dicts by them, and
name each bad key of a validation error by its path."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from training.errors import ConfigError

# A search-space entry's own key is a dotted path too (sweep.search_space.train.lr).
_SEARCH_SPACE = "sweep.search_space."


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value (an empty dict is a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def get_dotted(tree: dict[str, Any], key: str) -> Any:
    """The value at ``key``; KeyError when a part of the path is missing."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def _split_key(key: str) -> list[str]:
    """Dotted path -> parts; a search-space entry's own key (e.g. train.lr) stays whole."""
    if key.startswith(_SEARCH_SPACE) and len(key) > len(_SEARCH_SPACE):
        return ["sweep", "search_space", key[len(_SEARCH_SPACE) :]]
    return key.split(".")


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` in place, creating missing sections; ConfigError when a part is a value."""
    parts = _split_key(key)
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def describe_errors(exc: ValidationError) -> str:
    """Every error of a validation, one line each, named by its dotted key."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        given = err.get("input")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; `trainflow config show` lists every key)"
        elif not isinstance(given, dict) and "credentials" not in msg:  # never echo a secret
            msg = f"{msg} (got {given!r})"
        lines.append(f"  {key}: {msg}")
    return "invalid configuration:\n" + "\n".join(lines)
