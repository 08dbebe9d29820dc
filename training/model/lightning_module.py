"""``train.engine: lightning``: the Lightning package trainflow trains with, and the check that
``model.factory`` returns a LightningModule of it.

The package is ``lightning`` (``lightning.pytorch``), the one Ray Train's Lightning integration
imports first; it comes with the ``[lightning]`` extra. A module written against the older
``pytorch_lightning`` package is another class to ``lightning.pytorch.Trainer``, which refuses
it, so it is refused here, before anything starts.
"""

from __future__ import annotations

from typing import Any

from training.errors import ConfigError

INSTALL = "pip install -e '.[lightning]'"
_SIGNATURE = "def build(spec, **params) -> lightning.pytorch.LightningModule"


def lightning_pytorch():
    """``lightning.pytorch``; a ConfigError naming the extra when it is not installed."""
    try:
        import lightning.pytorch as pl
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "lightning":
            raise  # Lightning is there but lacks a dependency: its own error says which
        raise ConfigError(
            f"train.engine=lightning needs the Lightning package: {INSTALL} (Lightning 2.6, "
            "where the driver and the Ray workers run)"
        ) from None
    return pl


def check_lightning_module(factory: str, built: Any) -> None:
    """ConfigError naming ``model.factory`` unless ``built`` is a LightningModule."""
    pl = lightning_pytorch()
    if isinstance(built, pl.LightningModule):
        return
    bases = [f"{cls.__module__}.{cls.__qualname__}" for cls in type(built).__mro__[1:-1]]
    older = any(base.startswith("pytorch_lightning.") for base in bases)
    hint = (
        "import LightningModule from lightning.pytorch (Ray's integration trains with the "
        "lightning package, not pytorch_lightning)"
        if older
        else f"with train.engine=lightning it is called as {_SIGNATURE}"
    )
    raise ConfigError(
        f"model.factory={factory!r}: it returned {type(built).__name__}, not a "
        f"lightning.pytorch.LightningModule; {hint}"
    )
