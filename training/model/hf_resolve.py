"""A Hugging Face model's architecture and tokenizer, resolved on the driver before anything
starts: from a local directory, a hub id (Hugging Face's own client, its cache first; offline
when HF_HUB_OFFLINE=1), or a config dict. Every failure is one ``ConfigError`` naming the key."""

from __future__ import annotations

import os
from typing import Any

from training.config.schema_hf import TRAIN_TOKENIZER, HFConfig
from training.errors import ConfigError, one_line

#: Special tokens of a WordPiece tokenizer trainflow fits (``model.hf.tokenizer: train``); the
#: pad token first, so its id is 0, BERT's default pad_token_id.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _unreachable(key: str, name: str, exc: BaseException, what: str = "model") -> ConfigError:
    where = "is not a directory and" if not os.path.isdir(name) else "is a directory but"
    fix = "; or set model.hf.tokenizer: train to fit one on the data" if what != "model" else ""
    return ConfigError(
        f"{key}={name!r} {where} could not be loaded as a Hugging Face {what} from a local "
        f"directory or the hub ({one_line(exc, limit=200)}); a hub id needs the network (and "
        f"HF_HUB_OFFLINE unset) once, or give a local directory written by save_pretrained{fix}"
    )


def architecture(hf: HFConfig) -> Any:
    """The model's transformers config: ``AutoConfig.for_model(**config)`` or the pretrained
    model's own. A config dict's bos/eos ids past its vocabulary are None, as the model is
    built (``causal_lm.lm_config``): built with them, transformers warns on the console before
    the run's log file takes the libraries' output."""
    from transformers import AutoConfig

    from training.model.trainflow_pyfunc.causal_lm import ids_past_the_vocabulary

    if hf.config is not None:
        try:
            return AutoConfig.for_model(**{**hf.config, **ids_past_the_vocabulary(hf.config)})
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                f"model.hf.config does not make a transformers config: {one_line(exc)}; give "
                "model_type (e.g. bert) and that config's own keys"
            ) from None
    try:
        return AutoConfig.from_pretrained(hf.name_or_path)
    except (OSError, ValueError) as exc:
        raise _unreachable("model.hf.name_or_path", str(hf.name_or_path), exc) from None


def tokenizer_source(hf: HFConfig) -> str | None:
    """Where the tokenizer comes from: a directory or hub id, or None to fit one on train."""
    if hf.tokenizer == TRAIN_TOKENIZER:
        return None
    return hf.tokenizer or hf.name_or_path


def pretrained_tokenizer(name: str) -> Any:
    """A fast tokenizer (``AutoTokenizer``) from a directory or hub id."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, TypeError) as exc:
        raise _unreachable("model.hf.tokenizer", name, exc, "tokenizer") from None
    words = tokenizer.backend_tokenizer.get_vocab_size() if tokenizer.is_fast else 0
    if tokenizer.is_fast and words <= len(set(tokenizer.all_special_ids)):
        # transformers builds an empty tokenizer for a model directory without tokenizer files:
        # every word would be [UNK].
        raise ConfigError(
            f"model.hf.tokenizer={name!r} has no vocabulary ({words} tokens, all special): the "
            "directory holds no tokenizer files; give a tokenizer directory, or set "
            "model.hf.tokenizer: train to fit one on the data"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"model.hf.tokenizer={name!r} has no fast (Rust) tokenizer; trainflow serialises "
            "tokenizers as tokenizer.json: give one with a tokenizer.json, or 'train'"
        )
    return tokenizer


def chat_template(tokenizer: Any, name: str) -> dict[str, Any]:
    """``data.chat_template``'s state: the tokenizer's chat template (a Jinja string) and the
    special tokens it may name; a ConfigError where the tokenizer has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one formats a conversation
        template = template.get("default")
    if not template:
        raise ConfigError(
            f"data.chat_template: true but model.hf.tokenizer={name!r} has no chat template "
            "(tokenizer_config.json's chat_template, or chat_template.jinja); give a tokenizer "
            "with one, or set data.chat_template: false (the prompt and response are then "
            "tokenized as they are)"
        )
    special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    return {"chat_template": str(template), "special_tokens": special}


def pad_id(tokenizer: Any) -> int:
    """The pad token's id (a tokenizer without one pads with its end-of-text token, else 0)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def check_fits(config: Any, vocab_size: int, max_length: int) -> None:
    """The tokenizer's ids and data.max_length fit the model's embeddings."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and max_length > int(positions):
        raise ConfigError(
            f"data.max_length={max_length} is more than the model's {positions} position "
            f"embeddings (max_position_embeddings); set data.max_length <= {positions}"
        )
    model_vocab = getattr(config, "vocab_size", None)
    if model_vocab is not None and vocab_size > int(model_vocab):
        raise ConfigError(
            f"the tokenizer has {vocab_size} tokens but the model's vocab_size is {model_vocab}: "
            "ids past it have no embedding; use the model's own tokenizer, or a model config "
            f"with vocab_size >= {vocab_size}"
        )
