"""``model.hf``: a Hugging Face sequence-classification model (``model.kind: hf``), from a
pretrained directory or hub id, or randomly initialised from a config, with its tokenizer and an
optional LoRA adapter."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from training.config.schema_base import Section

#: ``model.hf.tokenizer``: fit a WordPiece tokenizer on the training split's texts.
TRAIN_TOKENIZER = "train"


class LoraConfig(Section):
    """A LoRA adapter (PEFT): only the adapter's low-rank matrices (and the head) train."""

    r: int = Field(8, ge=1, description="rank of the adapter matrices (sweepable)")
    alpha: float = Field(16.0, gt=0, description="scaling: alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] | None = Field(
        None, description="module names to adapt; default: PEFT's choice for the model type"
    )


class HFConfig(Section):
    """Exactly one of ``name_or_path`` (pretrained) and ``config`` (random init)."""

    name_or_path: str | None = Field(
        None, description="a local model directory or a hub id (needs the network once)"
    )
    config: dict[str, Any] | None = Field(
        None, description="AutoConfig.for_model(**config), e.g. {model_type: bert, ...}"
    )
    tokenizer: str | None = Field(
        None,
        description="'train' (WordPiece fitted on the train split), a tokenizer directory or "
        "hub id; default: the model's own (name_or_path)",
    )
    lora: LoraConfig | None = Field(None, description="train a LoRA adapter instead of all weights")

    @model_validator(mode="after")
    def _one_source(self) -> HFConfig:
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("give exactly one of model.hf.name_or_path and model.hf.config")
        if self.config is not None:
            if not isinstance(self.config.get("model_type"), str):
                raise ValueError("model.hf.config needs model_type, e.g. {model_type: bert}")
            if self.tokenizer is None:
                raise ValueError(
                    "model.hf.config builds a new model with no tokenizer of its own: set "
                    "model.hf.tokenizer to 'train' or a tokenizer directory"
                )
        return self
