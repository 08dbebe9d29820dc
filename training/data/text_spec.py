"""A text model's feature spec (``model.kind: hf``): the table's one text column, and the
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
    found = declared or [c for c in strings if fit and fit.string_role(c) == "text"]
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


def _texts(batch: pd.DataFrame, plan: Plan, seed: int, split, column: str, keep: bool):
    """Rows of interest only: train rows' hashes and texts where ``keep``, and every row whose
    value is not text, with its repr (any split: refused before a row is written)."""
    labels = labels_of(batch, plan.label)
    hashes = hash_rows(raw_values(batch, plan.hash_roles), labels, seed)
    train = (assign_splits(hashes, split) == "train") & ~missing_labels(labels)
    values = batch[column].tolist()
    good = np.fromiter((isinstance(v, str) for v in values), dtype=bool, count=len(values))
    wanted = train & good if keep else np.zeros(len(values), dtype=bool)
    rows = np.flatnonzero(wanted | ~good)
    return pd.DataFrame(
        {
            "key": hashes[rows].view(np.int64),
            "text": [values[i] if good[i] else "" for i in rows],
            "bad": ["" if good[i] else repr(values[i]) for i in rows],
        }
    )


def scan_texts(
    ds: ray.data.Dataset, plan: Plan, config: PipelineConfig, column: str, keep: bool
) -> list[str]:
    """Check every row's text is a string (one error naming the column, before any row is
    written) and, with ``keep``, return the training split's texts: at most TOKENIZER_TEXTS,
    a deterministic sample (the smallest row hashes), in a fixed order."""
    split = config.data.split
    kwargs = {"plan": plan, "seed": split.seed, "split": split, "column": column, "keep": keep}
    frame = ds.map_batches(_texts, batch_format="pandas", fn_kwargs=kwargs).to_pandas()
    if frame.empty:  # no row of interest: every text is fine and none is kept
        return []
    bad = frame["bad"][frame["bad"] != ""]
    if len(bad):
        raise DataValidationError(
            f"text column {column!r} holds {len(bad)} value(s) that are not text (e.g. "
            f"{bad.iloc[0]}); every row needs a string (drop or fill those rows)"
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


def tokens_state(ds, plan: Plan, config: PipelineConfig, column: str) -> dict[str, Any]:
    """The tokens step's plain-data state: column, tokenizer JSON, max_length, pad_id."""
    hf, max_length = config.model.hf, config.data.max_length
    architecture = hf_resolve.architecture(hf)
    source = hf_resolve.tokenizer_source(hf)
    texts = scan_texts(ds, plan, config, column, keep=source is None)
    if source is None:
        tokenizer = fit_wordpiece(texts, architecture.vocab_size)
        pad = tokenizer.token_to_id("[PAD]")
    else:
        pretrained = hf_resolve.pretrained_tokenizer(source)
        tokenizer, pad = pretrained.backend_tokenizer, hf_resolve.pad_id(pretrained)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    hf_resolve.check_fits(architecture, vocab, max_length)
    state = {
        "column": column,
        "tokenizer": tokenizer.to_str(),
        "max_length": int(max_length),
        "pad_id": int(pad),
        "vocab_size": int(vocab),
    }
    if config.data.task == "causal_lm" and config.data.pack:
        state["truncate"] = False  # whole texts, cut into blocks of max_length when packed
    return state


def text_spec(
    ds, stats: Stats, config: PipelineConfig, plan: Plan, classes: list[Any], task: str
) -> tuple[FeatureSpec, dict[str, str]]:
    """The spec of a text model, and the columns it leaves out (with the reason)."""
    column = text_column(plan, stats, config)
    label_mean, label_std = 0.0, 1.0
    if task == "regression":
        n_label, label_mean, label_m2 = stats.label_train
        label_std = math.sqrt(label_m2 / n_label)
    roles = {c: ("text" if c == column else r) for c, r in plan.hash_roles.items()}
    ignored = {c: NOT_USED for c in roles if c != column}
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
        tokens=tokens_state(ds, plan, config, column),
    )
    return spec, ignored
