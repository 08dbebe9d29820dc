"""What ``train.engine: lightning`` needs of the rest of the config: a factory to build the
user's LightningModule, and a sweep over what the Trainer trainflow builds actually reads."""

from __future__ import annotations

from typing import Any

#: The train.* keys the Lightning engine reads (the Trainer's batches, seed and precision);
#: the optimizer is the module's own (``configure_optimizers``), so train.lr and the rest
#: would be swept without effect.
SWEPT_TRAIN_KEYS = ("train.batch_size", "train.seed", "train.precision")


def check_lightning(config: Any) -> None:
    """ValueError unless the LightningModule has a factory and every swept key reaches it
    (``config``: the PipelineConfig being validated, which imports this module)."""
    if config.model.kind != "custom":
        raise ValueError(
            "train.engine=lightning needs model.kind: custom with model.factory: the function "
            "that returns your LightningModule, called as factory(spec, **model.params)"
        )
    if not config.sweep.enabled:
        return
    unread = [
        key
        for key in config.sweep.search_space
        if not key.startswith("model.params.") and key not in SWEPT_TRAIN_KEYS
    ]
    if unread:
        raise ValueError(
            f"sweep.search_space {', '.join(unread)}: train.engine=lightning does not read "
            "them (your LightningModule's configure_optimizers owns the optimizer); sweep "
            "model.params.<name> (the factory's keywords) or "
            f"{', '.join(SWEPT_TRAIN_KEYS)}"
        )
