"""A table's columns as users hold them: roles inferred (and declared), gaps imputed with the
train median and flagged, categories as vocabulary codes (unseen -> unknown), datetimes as
numbers, the MLP embedding categorical positions, and bad input as one clear error."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from training.config import DataConfig
from training.data.rows import transform_batch
from training.data.schema import check_schema
from training.data.summary import Stats, summarise
from training.data.validate import feature_spec, validate
from training.errors import DataValidationError
from training.model.trainflow_pyfunc.networks import MLP, build_network, embedding_size
from training.model.trainflow_pyfunc.transform_steps import MISSING, UNKNOWN, datetime_width

ROWS = 400


def _table(rows: int = ROWS) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    colour = rng.choice(["red", "green", "blue"], rows, p=[0.5, 0.3, 0.2]).astype(object)
    colour[::17] = None
    size = rng.normal(10.0, 2.0, rows)
    size[::13] = np.nan
    return pd.DataFrame(
        {
            "size": size,
            "colour": colour,
            "when": pd.date_range("2021-01-01", periods=rows, freq="7h"),
            "order_id": [f"O{i:06d}" for i in range(rows)],
            "note": [f"a long free text note number {i} with spaces" for i in range(rows)],
            "y": rng.choice(["a", "b"], rows),
        }
    )


def _fit(frame: pd.DataFrame, tmp_path, **data):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    config = DataConfig(source=path, label_column="y", **data)
    plan = check_schema(config, [path], "parquet", None)
    stats = Stats()
    batch = pq.read_table(path, columns=plan.columns).to_pandas()
    stats.add(pickle.loads(summarise(batch, plan, config.split)["summary"][0]))
    task, _, classes = validate(stats, config, plan, [path])
    return feature_spec(stats, config, plan, classes, task), batch


def test_roles_are_inferred_ids_left_out_and_free_text_hashed(tmp_path):
    spec, _ = _fit(_table(), tmp_path)
    assert spec.column_roles == {
        "size": "numeric",
        "colour": "categorical",
        "when": "datetime",
        "order_id": "id-like",
        "note": "text",
    }
    assert spec.text_columns == ["note"] and spec.text_features == 4096


def test_a_declared_role_wins(tmp_path):
    spec, _ = _fit(_table(), tmp_path, columns={"order_id": "ignore", "note": "categorical"})
    assert spec.column_roles["order_id"] == "ignore"
    assert spec.column_roles["note"] == "categorical"


def test_short_strings_declared_text_are_hashed_not_counted(tmp_path):
    spec, batch = _fit(_table(), tmp_path, columns={"colour": "text"}, text_features=32)
    assert spec.column_roles["colour"] == "text" and "colour" not in spec.categories
    assert spec.text_columns == ["colour", "note"] and spec.text_features == 32
    out = transform_batch(batch, spec, with_labels=False)["features"]
    assert out.shape[1] == len(spec.mean) == len(spec.cardinalities)
    colour = out[:, -64:-32]
    red = (batch["colour"] == "red").to_numpy()
    assert len({row.tobytes() for row in colour[red]}) == 1  # the same word, the same bag
    assert not colour[batch["colour"].isna().to_numpy()].any()


def test_gaps_get_the_train_median_and_a_flag(tmp_path):
    frame = _table()
    spec, batch = _fit(frame, tmp_path)
    assert spec.indicator_columns == ["size"]
    assert abs(spec.medians[0] - np.nanmedian(frame["size"])) < 0.5
    out = transform_batch(batch, spec, with_labels=False)["features"]
    gap = np.isnan(frame["size"].to_numpy())
    median_z = (spec.medians[0] - spec.mean[0]) / spec.std[0]
    np.testing.assert_allclose(out[gap, 0], median_z, rtol=1e-6)
    assert (out[gap, 1] == 1).all() and (out[~gap, 1] == 0).all()


def test_categories_are_codes_most_frequent_first_unseen_unknown(tmp_path):
    spec, batch = _fit(_table(), tmp_path, max_categories=2)
    assert spec.categories == {"colour": ["red", "green"]}
    position = spec.cardinalities.index(4)  # unknown, missing, red, green
    batch = batch.copy()
    batch.loc[:3, "colour"] = ["red", "blue", None, "purple"]
    out = transform_batch(batch, spec, with_labels=False)["features"]
    assert out[:4, position].tolist() == [2.0, UNKNOWN, MISSING, UNKNOWN]


def test_datetimes_become_year_and_cycles(tmp_path):
    spec, batch = _fit(_table(), tmp_path)
    assert spec.datetime_columns == ["when"]
    out = transform_batch(batch, spec, with_labels=False)["features"]
    width = datetime_width(spec.to_dict())
    assert width == 9  # year, then month, weekday, hour and day of year as (sin, cos)
    year = len(spec.mean) - width - spec.text_features * len(spec.text_columns)
    month = out[:, year + 1 : year + 3]  # sin, cos of the month
    np.testing.assert_allclose((month**2).sum(axis=1), 1.0, rtol=1e-5)
    assert out.shape[1] == len(spec.mean) == len(spec.cardinalities)


def test_the_mlp_embeds_categorical_positions():
    network = build_network(
        {"kind": "mlp", "hidden_sizes": [8], "dropout": 0.0}, [3], 2, "classification", [0, 5, 0]
    )
    assert isinstance(network, MLP) and len(network.embeddings) == 1
    assert network.embeddings[0].num_embeddings == 5
    assert network.embeddings[0].embedding_dim == embedding_size(5)
    x = torch.tensor([[0.5, 4.0, -1.0], [0.5, 1.0, -1.0]])
    out = network(x)
    assert out.shape == (2, 2) and not torch.equal(out[0], out[1])


def test_an_all_numeric_mlp_keeps_its_state_dict_keys():
    plain = build_network({"kind": "mlp", "hidden_sizes": [8], "dropout": 0.0}, [4], 2)
    assert set(plain.state_dict()) == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"}


@pytest.mark.parametrize(
    ("change", "data", "message"),
    [
        (
            lambda f: f.assign(size=["big"] * len(f)),
            {"columns": {"size": "numeric"}},
            r"'size' is declared numeric but holds text .*'big'",
        ),
        (
            lambda f: f.assign(note="not a date"),
            {"columns": {"note": "datetime"}},
            r"datetime column 'note' holds a value that is not a date \(e.g. 'not a date'\)",
        ),
        (
            lambda f: f,
            {"columns": {"size": "text"}},
            r"'size' is declared text but holds double values .*\(e.g. \d+\.\d+\)",
        ),
        (lambda f: f.assign(size=np.nan), {}, r"\['size'\] are empty in every training row"),
        (lambda f: f[["order_id", "y"]], {}, "no feature column is left"),
        (lambda f: f, {"columns": {"nope": "numeric"}}, r"data.columns names \['nope'\]"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, change, data, message):
    with pytest.raises(DataValidationError, match=message):
        _fit(change(_table()), tmp_path, **data)


def test_the_mixed_table_gets_its_roles(tmp_path):
    from training.datasets.synthetic_mixed import mixed_chunk

    spec, _ = _fit(
        mixed_chunk(3_000, seed=0, index=0).to_pandas().rename(columns={"label": "y"}), tmp_path
    )
    assert spec.column_roles == {
        "amount": "numeric",
        "tenure": "numeric",
        "score": "numeric",
        "plan": "categorical",
        "region": "categorical",
        "signup": "datetime",
        "customer_id": "id-like",
    }
    assert spec.indicator_columns == ["amount", "tenure", "score"]
    assert len(spec.categories["region"]) == 100  # data.max_categories


def test_the_row_hash_reads_every_column_raw_and_deterministically():
    from training.data.rows import row_hashes

    roles = {"size": "numeric", "colour": "categorical", "when": "datetime"}
    frame = _table(20)[[*roles, "y"]]

    def hashes(rows: pd.DataFrame) -> np.ndarray:
        return row_hashes(rows, label_column="y", roles=roles, seed=0)

    first = hashes(frame)
    np.testing.assert_array_equal(first, hashes(frame.copy()))  # gaps hash alike every time
    for column, value in (("colour", "violet"), ("when", pd.Timestamp("1999-01-01"))):
        changed = frame.copy()
        changed.loc[0, column] = value
        other = hashes(changed)
        assert other[0] != first[0] and (other[1:] == first[1:]).all()
    as_text = frame.assign(when=frame["when"].astype(str))  # a CSV's dates: the same instants
    np.testing.assert_array_equal(first, hashes(as_text))
