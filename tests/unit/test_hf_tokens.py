"""A text model's tokens step: a WordPiece tokenizer fitted offline, token ids truncated and not
padded, stored as variable-length lists and padded per batch when read; text that is not text
refused naming the column; training's rows and the served model's input agree (parity)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from hf_fixtures import bbc_texts, fitted_tokens, hf_model_config, text_spec

from training.config import SplitConfig
from training.data.rows import output_rows
from training.data.token_lists import padded_lists, token_lists
from training.errors import DataValidationError
from training.loop.collate import SplitCollate
from training.manifest import FEATURES, FeatureSpec
from training.model.trainflow_pyfunc import transform
from training.model.trainflow_pyfunc.tokens import PAD, pad_flat, padded
from training.model.trainflow_pyfunc.transform_steps import TransformError


@pytest.fixture(scope="module")
def tokens() -> dict:
    return fitted_tokens(max_length=16)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    pairs = bbc_texts(per_topic=4)
    frame = pd.DataFrame({"text": [t for t, _ in pairs], "topic": [c for _, c in pairs]})
    frame.loc[0, "text"] = "Short one."  # fewer tokens than max_length
    return frame


def test_the_fitted_tokenizer_pads_with_id_0_and_wraps_texts_in_cls_sep(tokens):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokens["tokenizer"])
    assert tokens["pad_id"] == tokenizer.token_to_id("[PAD]") == 0
    ids = tokenizer.encode("shares rose").ids
    assert ids[0] == tokenizer.token_to_id("[CLS]") and ids[-1] == tokenizer.token_to_id("[SEP]")
    assert 100 < tokens["vocab_size"] <= 300


def test_token_ids_are_truncated_to_max_length_and_not_padded(tokens, table):
    from tokenizers import Tokenizer

    rows = transform.transform(table, text_spec(tokens), with_labels=True)
    lengths = [len(r) for r in rows[FEATURES]]
    short = len(Tokenizer.from_str(tokens["tokenizer"]).encode("Short one.").ids)
    assert max(lengths) == 16 and lengths[0] == short < 16
    assert all(r.dtype == np.int32 for r in rows[FEATURES])
    assert rows["label"].tolist()[:1] == [0]


def test_text_that_is_not_text_is_one_error_naming_the_column(tokens):
    frame = pd.DataFrame({"text": ["fine words here", 42, None], "topic": ["tech"] * 3})
    with pytest.raises(TransformError, match=r"text column 'text' holds 2 value\(s\) that are not"):
        transform.transform(frame, text_spec(tokens), with_labels=False)


def test_padding_fills_past_each_rows_end_with_pad():
    rows = np.empty(3, dtype=object)
    for i, ids in enumerate(([5, 6, 7], [8], [])):
        rows[i] = np.array(ids, np.int32)
    assert padded(rows).tolist() == [[5, 6, 7], [8, PAD, PAD], [PAD, PAD, PAD]]
    assert pad_flat(np.array([1, 2]), np.array([2]), width=4).tolist() == [[1, 2, PAD, PAD]]


def test_arrow_lists_pad_like_numpy_rows_even_when_sliced():
    rows = np.empty(4, dtype=object)
    for i, ids in enumerate(([1, 2, 3], [4], [5, 6], [7, 8, 9, 10])):
        rows[i] = np.array(ids, np.int32)
    column = token_lists(rows)
    assert column.type == pa.list_(pa.int32())
    assert padded_lists(column).tolist() == padded(rows).tolist()
    assert padded_lists(column.slice(1, 2)).tolist() == [[4, PAD], [5, 6]]
    assert padded_lists(column.slice(1, 2), width=5).shape == (2, 5)


def test_the_loop_collate_pads_a_batch_to_its_longest_row(tokens, table):
    spec = FeatureSpec.from_dict(text_spec(tokens))
    written = output_rows(table, spec, SplitConfig())
    batch = SplitCollate()(written)
    features = batch[FEATURES]
    lengths = [len(v) for v in written.column(FEATURES).to_pylist()]
    assert features.dtype == torch.float32 and features.shape == (len(table), max(lengths))
    short = lengths[0]
    assert short < max(lengths)
    assert (features[0, short:] == PAD).all() and (features[0, :short] >= 0).all()


def test_training_rows_and_the_served_models_input_agree(tokens, table, tmp_path):
    """Parity: the ids preprocessing writes are the ids the registered model's network gets."""
    import mlflow.pyfunc

    from training.model.trainflow_pyfunc.networks import build_network
    from training.tracking import flavour

    spec = text_spec(tokens)
    model_config = hf_model_config()
    network = build_network(model_config, spec["input_shape"], 3, "classification", None, tokens)
    state = {"model": network.state_dict(), "spec": spec, "model_config": model_config}
    path = flavour.save_model(state, str(tmp_path / "model"), table.drop(columns=["topic"]).head(4))
    served = mlflow.pyfunc.load_model(path)
    seen = []
    inner = served.unwrap_python_model().network
    hook = inner.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    out = served.predict(table[["text"]])
    hook.remove()
    written = output_rows(table, FeatureSpec.from_dict(spec), SplitConfig())
    expected = padded_lists(written.column(FEATURES))
    assert np.array_equal(seen[0].cpu().numpy(), expected.astype(np.int64))
    assert list(out.columns) == ["prediction", "business", "sports", "tech"]
    assert np.allclose(out[["business", "sports", "tech"]].sum(axis=1), 1.0)
    from tokenizers import Tokenizer

    shipped = Tokenizer.from_file(str(tmp_path / "model" / "artifacts" / "tokenizer.json"))
    assert (
        shipped.encode("shares rose").ids
        == Tokenizer.from_str(tokens["tokenizer"]).encode("shares rose").ids
    )


def test_the_served_model_refuses_a_number_for_text(tokens, table, tmp_path):
    from mlflow.exceptions import MlflowException

    from training.model.trainflow_pyfunc.model import TrainflowModel
    from training.model.trainflow_pyfunc.networks import build_network

    spec = text_spec(tokens)
    network = build_network(hf_model_config(), [16], 3, "classification", None, tokens)
    model = TrainflowModel()
    state = {"model": network.state_dict(), "spec": spec, "model_config": hf_model_config()}
    model.load_state(state)
    with pytest.raises(MlflowException, match="text column 'text'"):
        model.predict(None, pd.DataFrame({"text": ["words", 3.5]}))


def test_preprocessing_names_a_non_text_value_as_a_data_error(tokens):
    spec = FeatureSpec.from_dict(text_spec(tokens))
    frame = pd.DataFrame({"text": ["fine words here", 7], "topic": ["tech", "sports"]})
    with pytest.raises(DataValidationError, match="text column 'text'"):
        output_rows(frame, spec, SplitConfig())


def test_a_text_model_needs_exactly_one_text_column():
    from training.config import validate_config
    from training.data.schema import Plan
    from training.data.summary import Stats
    from training.data.text_spec import text_column

    hf = {"kind": "hf", "hf": {"config": {"model_type": "bert"}, "tokenizer": "train"}}
    plan = Plan("parquet", "y", [], None, {"code": "categorical", "n": "numeric"})
    config = validate_config({"model": hf})
    with pytest.raises(DataValidationError, match="model.kind=hf needs a text column"):
        text_column(plan, Stats(), config)
    declared = validate_config({"model": hf, "data": {"columns": {"code": "text"}}})
    assert text_column(plan, Stats(), declared) == "code"


class _Batches:
    """Enough of a Ray Dataset for ``scan_texts``: map_batches over one pandas batch, and
    to_pandas as Ray Data gives it (no columns at all when every batch returned no rows)."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame

    def map_batches(self, fn, batch_format, fn_kwargs):
        assert batch_format == "pandas"
        return _Batches(fn(self.frame, **fn_kwargs))

    def to_pandas(self) -> pd.DataFrame:
        return self.frame if len(self.frame) else pd.DataFrame()


def _scan(frame: pd.DataFrame, keep: bool) -> list[str]:
    from training.config import validate_config
    from training.data.schema import Plan
    from training.data.text_spec import scan_texts

    plan = Plan("parquet", "topic", [], None, {"text": "categorical"})
    config = validate_config({"data": {"label_column": "topic"}})
    return scan_texts(_Batches(frame), plan, config, ["text"], keep)


def test_scanning_keeps_train_texts_in_a_fixed_order_and_refuses_non_text(table):
    kept = _scan(table, keep=True)
    assert 0 < len(kept) < len(table) and set(kept) <= set(table["text"])
    assert _scan(table.iloc[::-1].reset_index(drop=True), keep=True) == kept  # order-free
    assert _scan(table, keep=False) == []  # a pretrained tokenizer: nothing kept, all checked
    bad = table.assign(text=table["text"].where(table.index != 3, None))
    with pytest.raises(DataValidationError, match=r"text column 'text' holds 1 value\(s\)"):
        _scan(bad, keep=False)


def test_the_served_model_scores_texts_in_batches_padded_each_to_its_own_length(tokens, table):
    from training.model.trainflow_pyfunc import model as served
    from training.model.trainflow_pyfunc.networks import build_network

    spec = text_spec(tokens)
    network = build_network(hf_model_config(), [16], 3, "classification", None, tokens)
    state = {"model": network.state_dict(), "spec": spec, "model_config": hf_model_config()}
    model = served.TrainflowModel()
    model.load_state(state)
    whole = model.predict(None, table[["text"]])
    seen = []
    hook = model.network.register_forward_pre_hook(lambda _, args: seen.append(args[0].shape))
    short = table[["text"]].copy()
    short.loc[0, "text"] = "Short one."
    original, served.TEXT_BATCH = served.TEXT_BATCH, 1
    try:
        batched = model.predict(None, table[["text"]])
        model.predict(None, short.head(1))
    finally:
        served.TEXT_BATCH = original
        hook.remove()
    assert len(seen) == len(table) + 1 and seen[-1][1] < 16  # the short text: its own length
    assert batched["prediction"].tolist() == whole["prediction"].tolist()
    assert np.allclose(
        batched[["business", "sports", "tech"]], whole[["business", "sports", "tech"]], atol=1e-5
    )
