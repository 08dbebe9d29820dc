"""A text model's feature spec (``model.kind: hf``): the table's one text column (a language
model's prompt and response columns, ``data.prompt_column`` / ``data.response_column``), and the
tokenizer resolved here on the driver (a pretrained one, or a WordPiece tokenizer fitted on the
training split's texts, offline) and stored as plain data for the ``tokens`` step.

The rows' identity and split are the table's as always (every column read is hashed), so the
same rows land in the same splits whatever the model; only the text column feeds the network.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from training.config import PipelineConfig
from training.data.rows import assign_splits, hash_rows, labels_of, missing_labels, raw_values
from training.data.schema import Plan
from training.data.summary import Stats
from training.errors import DataValidationError
from training.manifest import FeatureSpec
from training.model import hf_resolve
from training.model.trainflow_pyfunc.prompts import PROMPT_COLUMN, RESPONSE_COLUMN

if TYPE_CHECKING:
    import ray.data

#: At most this many train texts fit the tokenizer: those of the smallest row hashes.
TOKENIZER_TEXTS = 50_000
#: Why a column other than the text column is left out.
NOT_USED = "not used by model.kind=hf (it reads the text column only)"
#: Why a language model's table's label column is left out.
LABEL_NOT_USED = "not used by data.task=causal_lm (the model learns the text itself)"


def text_column(plan: Plan, stats: Stats, config: PipelineConfig) -> str:
    """The table's one text column: declared (``data.columns: {x: text}``) or found free text."""
    declared = [c for c, r in config.data.columns.items() if r == "text"]
    fit = stats.table
    strings = [c for c, r in plan.roles.items() if r == "categorical"]
    free = [c for c in strings if fit and (found := fit.string_role(c)) and found.free]
    found = declared or free
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataValidationError(
            f"model.kind=hf needs a text column, and none of {list(plan.roles)[:10]} holds free "
            "text (long strings, most with spaces); declare it: data.columns: {name: text}"
        )
    raise DataValidationError(
        f"columns {found[:10]} all hold text but model.kind=hf reads one; declare it "
        f"(data.columns: {{{found[0]}: text}}) and leave the others out (data.columns: "
        "{name: ignore})"
    )


def _texts(batch: pd.DataFrame, plan: Plan, seed: int, split, columns: list[str], keep: bool):
    """Rows of interest only: train rows' hashes and texts (a row's columns joined) where
    ``keep``, and every row with a value that is not text, with its column and repr (any
    split: refused before a row is written)."""
    labels = labels_of(batch, plan.label)
    hashes = hash_rows(raw_values(batch, plan.hash_roles), labels, seed)
    train = (assign_splits(hashes, split) == "train") & ~missing_labels(labels)
    values = [batch[c].tolist() for c in columns]
    by_name = dict(zip(columns, values, strict=True))
    # Per row: the first of its columns whose value is not text ("": none).
    first_bad = np.full(len(batch), "", dtype=object)
    for column in reversed(columns):
        is_text = np.fromiter((isinstance(v, str) for v in by_name[column]), bool, len(batch))
        first_bad[~is_text] = column
    good = first_bad == ""
    wanted = train & good if keep else np.zeros(len(good), dtype=bool)
    rows = np.flatnonzero(wanted | ~good)
    return pd.DataFrame(
        {
            "key": hashes[rows].view(np.int64),
            "text": ["\n".join(v[i] for v in values) if good[i] else "" for i in rows],
            "column": [first_bad[i] for i in rows],
            "bad": ["" if good[i] else repr(by_name[first_bad[i]][i]) for i in rows],
        }
    )


def scan_texts(
    ds: ray.data.Dataset, plan: Plan, config: PipelineConfig, columns: list[str], keep: bool
) -> list[str]:
    """Check every row's texts are strings (one error naming the column, before any row is
    written) and, with ``keep``, return the training split's texts: at most TOKENIZER_TEXTS,
    a deterministic sample (the smallest row hashes), in a fixed order."""
    split = config.data.split
    kwargs = {"plan": plan, "seed": split.seed, "split": split, "columns": columns, "keep": keep}
    frame = ds.map_batches(_texts, batch_format="pandas", fn_kwargs=kwargs).to_pandas()
    if frame.empty:  # no row of interest: every text is fine and none is kept
        return []
    bad = frame[frame["bad"] != ""]
    if len(bad):
        column = bad["column"].iloc[0]
        count = int((bad["column"] == column).sum())
        raise DataValidationError(
            f"text column {column!r} holds {count} value(s) that are not text (e.g. "
            f"{bad['bad'].iloc[0]}); every row needs a string (drop or fill those rows)"
        )
    frame = frame.sort_values("key", kind="stable").head(TOKENIZER_TEXTS)
    return frame["text"].tolist()


def fit_wordpiece(texts: list[str], vocab_size: int) -> Any:
    """A BERT-style WordPiece tokenizer (lower-cased, [CLS] text [SEP]) fitted on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(hf_resolve.SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def tokens_state(ds, plan: Plan, config: PipelineConfig, columns: list[str]) -> dict[str, Any]:
    """The tokens step's plain-data state: its column(s), the tokenizer JSON (and chat
    template), max_length, pad_id."""
    hf, data = config.model.hf, config.data
    architecture = hf_resolve.architecture(hf)
    source = hf_resolve.tokenizer_source(hf)
    texts = scan_texts(ds, plan, config, columns, keep=source is None)
    chat: dict[str, Any] = {}
    if source is None:
        tokenizer = fit_wordpiece(texts, architecture.vocab_size)
        pad = tokenizer.token_to_id("[PAD]")
    else:
        pretrained = hf_resolve.pretrained_tokenizer(source)
        tokenizer, pad = pretrained.backend_tokenizer, hf_resolve.pad_id(pretrained)
        chat = hf_resolve.chat_template(pretrained, source) if data.chat_template else {}
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    hf_resolve.check_fits(architecture, vocab, data.max_length)
    state = {
        "tokenizer": tokenizer.to_str(),
        "max_length": int(data.max_length),
        "pad_id": int(pad),
        "vocab_size": int(vocab),
        **chat,
    }
    if data.response_column:  # the loss on the response's tokens only (``prompts.py``)
        state.update({PROMPT_COLUMN: columns[0], RESPONSE_COLUMN: columns[1]})
    else:
        state["column"] = columns[0]
    if data.task == "causal_lm" and data.pack:
        state["truncate"] = False  # whole texts, cut into blocks of max_length when packed
    return state


def token_sources(plan: Plan, stats: Stats, config: PipelineConfig) -> list[str]:
    """The columns tokenized: the prompt and response columns, or the one text column."""
    data = config.data
    if not data.response_column:
        return [text_column(plan, stats, config)]
    columns = [data.prompt_column, data.response_column]
    for column, key in zip(columns, ("prompt_column", "response_column"), strict=True):
        if column not in plan.roles:  # present (the schema checked), but left out
            why = plan.ignored.get(column) or f"declared {data.columns.get(column)!r}"
            raise DataValidationError(
                f"data.{key}={column!r} is not read ({why}); remove its data.columns role"
            )
    return columns


def text_spec(
    ds, stats: Stats, config: PipelineConfig, plan: Plan, classes: list[Any], task: str
) -> tuple[FeatureSpec, dict[str, str]]:
    """The spec of a text model, and the columns it leaves out (with the reason)."""
    columns = token_sources(plan, stats, config)
    label_mean, label_std = 0.0, 1.0
    if task == "regression":
        n_label, label_mean, label_m2 = stats.label_train
        label_std = math.sqrt(label_m2 / n_label)
    roles = {c: ("text" if c in columns else r) for c, r in plan.hash_roles.items()}
    ignored = {c: NOT_USED for c in roles if c not in columns}
    ignored.update(plan.ignored)
    if task == "causal_lm":
        ignored[config.data.label_column] = LABEL_NOT_USED
    spec = FeatureSpec(
        label_column=config.data.label_column,
        classes=classes,
        input_shape=[config.data.max_length],
        mean=[],
        std=[],
        task=task,
        label_mean=float(label_mean),
        label_std=float(label_std),
        column_roles=roles,
        tokens=tokens_state(ds, plan, config, columns),
    )
    return spec, ignored
