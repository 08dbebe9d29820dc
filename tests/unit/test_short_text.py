"""Short free text: a string column of mostly distinct values made of words (a car name, a
product name, a job title) is ``text``, hashed into word and character n-grams, so the words its
values share (the maker) carry signal; codes, hashes, UUIDs and e-mail addresses stay id-like,
few categories stay categorical, long free text is text as before, and a declared role wins."""

from __future__ import annotations

import hashlib
import uuid
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression
from test_table_columns import _fit

from training.data import preprocess
from training.data.fitting import TableFit, table_partial
from training.data.rows import hash_roles, transform_batch
from training.data.string_roles import made_of_words
from training.manifest import FeatureSpec
from training.model.trainflow_pyfunc import transform
from training.model.trainflow_pyfunc.text_features import hashed_block
from training.model.trainflow_pyfunc.transform import position_names
from training.model.trainflow_pyfunc.transform_steps import UNKNOWN

MAKERS = {"ford": "us", "chevrolet": "us", "toyota": "japan", "datsun": "japan"}
MAKERS |= {"volkswagen": "europe", "peugeot": "europe"}
TRIMS = ("custom", "deluxe", "wagon", "coupe", "sedan", "sport", "limited", "brougham")
#: Model words the training names never hold: a categorical sees only unknown values.
NEW_TRIMS = ("royale", "cruiser", "landau", "estate")


def _names(rows: int, seed: int, trims: tuple[str, ...] = TRIMS) -> tuple[list[str], list[str]]:
    """("<maker> <model words> <number>" names, each one's maker's origin: the label)."""
    rng = np.random.default_rng(seed)
    makers = rng.choice(list(MAKERS), rows)
    words = rng.choice(trims, (rows, 2))
    numbers = rng.integers(100, 999, rows)
    names = [f"{m} {a} {b} {n}" for m, (a, b), n in zip(makers, words, numbers, strict=True)]
    return names, [MAKERS[m] for m in makers]


def _role(values: list) -> tuple[str | None, str]:
    """(role, why) the rule gives a string column of ``values`` (all training rows)."""
    batch = pd.DataFrame({"c": pd.Series(values, dtype=object)})
    fit = TableFit(roles={"c": "categorical"})
    everyone = np.ones(len(batch), dtype=bool)
    keys = np.arange(len(batch), dtype=np.uint64)
    fit.add(table_partial(batch, {"c": "categorical"}, everyone, keys))
    found = fit.string_role("c")
    return (found.role, found.why) if found else (None, "")


def test_car_names_are_short_text_and_say_why():
    role, why = _role(_names(300, 0)[0])
    assert role == "text"
    assert why.startswith("short text: ") and "distinct" in why and "made of words" in why


def _ids(kind: str, rows: int = 300) -> list[str]:
    rng = np.random.default_rng(1)
    if kind == "codes":
        return [f"A-{i:06d}" for i in range(rows)]
    if kind == "uuids":
        return [str(uuid.UUID(int=int(rng.integers(0, 2**62)))) for _ in range(rows)]
    if kind == "hashes":
        return [hashlib.sha1(str(i).encode()).hexdigest() for i in range(rows)]
    if kind == "emails":
        return [f"user{i}@example.com" for i in range(rows)]
    return [f"{i:07d}" for i in rng.permutation(10**6)[:rows]]  # numeric codes


@pytest.mark.parametrize("kind", ["codes", "uuids", "hashes", "emails", "numbers"])
def test_codes_hashes_uuids_and_emails_stay_id_like(kind):
    assert _role(_ids(kind))[0] == "id-like"


@pytest.mark.parametrize(
    "values",
    [
        ["Biscoe", "Dream", "Torgersen"] * 100,
        ["male", "female"] * 150,
        ["United States", "South Africa", "New Zealand", "United Kingdom"] * 75,
    ],
)
def test_few_categories_stay_categorical(values):
    assert _role(values)[0] is None


def test_long_free_text_is_text_as_before():
    notes = [f"a long free text note number {i} with spaces" for i in range(300)]
    role, why = _role(notes)
    assert role == "text" and why.startswith("free text: ")


def test_many_repeated_titles_a_vocabulary_cannot_hold_are_text():
    """Each of 400 job titles five times: 20% distinct, but 100 categories hold a quarter."""
    rng = np.random.default_rng(2)
    first = ("senior", "junior", "lead", "staff", "principal")
    second = ("software", "data", "sales", "support", "product", "design", "research", "ops")
    third = ("engineer", "analyst", "manager", "designer", "writer", "scientist", "officer")
    titles = [f"{a} {b} {c}" for a in first for b in second for c in third]  # 280
    titles += [f"{t} ii" for t in titles[:120]]
    values = list(rng.permutation(titles * 5))
    role, why = _role(values)
    assert role == "text" and "most frequent values cover 25%" in why


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("chevrolet chevelle malibu", True),
        ("peugeot 504", True),
        ("mercedes-benz 280s", True),
        ("Braund, Mr. Owen Harris", True),
        ("A-000123", False),
        ("O000123", False),
        ("bob@example.com", False),
        ("550e8400-e29b-41d4-a716-446655440000", False),
        ("12345", False),
        ("AB12 CDE", False),
        ("", False),
    ],
)
def test_what_is_made_of_words(value, words):
    assert made_of_words(pd.Series([value])).tolist() == [words]


def _car_table(rows: int = 300) -> pd.DataFrame:
    names, origins = _names(rows, 3)
    weight = np.random.default_rng(4).normal(3000, 500, rows)
    return pd.DataFrame({"name": names, "weight": weight, "y": origins})


def test_a_car_name_column_is_text_in_the_spec_and_serving_reads_it_so(tmp_path):
    spec, batch = _fit(_car_table(), tmp_path, text_features=256)
    assert spec.column_roles == {"name": "text", "weight": "numeric"}
    assert spec.text_columns == ["name"] and "name" not in spec.categories
    assert spec.text_found["name"].startswith("short text: ")
    assert hash_roles(spec)["name"] == "categorical"  # rows hashed by the text, as read
    served = transform.transform(batch, spec.to_dict(), with_labels=False)["features"]
    trained = transform_batch(batch, spec, with_labels=False)["features"]
    np.testing.assert_array_equal(served, trained)
    old = {k: v for k, v in spec.to_dict().items() if k != "text_found"}  # an older spec
    again = transform_batch(batch, FeatureSpec.from_dict(old), with_labels=False)["features"]
    np.testing.assert_array_equal(again, trained)


def test_a_declared_role_wins_over_short_text(tmp_path):
    spec, _ = _fit(_car_table(), tmp_path, columns={"name": "categorical"})
    assert spec.column_roles["name"] == "categorical" and spec.text_found == {}


def _name_block(spec, frame: pd.DataFrame) -> np.ndarray:
    out = transform_batch(frame, spec, with_labels=False)["features"]
    return out[:, np.asarray(position_names(spec.to_dict())) == "name"]


def test_the_maker_carries_signal_to_names_never_seen(tmp_path):
    """Names with model words training never saw: as text the maker's word is in both rows'
    hashed features and a linear model reads the origin from it; as a category every such
    name is one unknown code."""
    table = _car_table()
    spec, _ = _fit(table, tmp_path, text_features=1024)
    names, origins = _names(200, 5, NEW_TRIMS)
    unseen = pd.DataFrame({"name": names, "weight": 3000.0, "y": origins})
    train, test = _name_block(spec, table), _name_block(spec, unseen)
    ford = hashed_block(np.array(["ford"], dtype=object), 1024)[0] != 0  # word, char grams
    rows = test[[n.startswith("ford ") for n in names]]
    assert ford.sum() >= 5 and len(rows) >= 2
    assert (rows[:, ford] != 0).mean(axis=1).min() >= 0.7  # every Ford row holds most of them
    model = LogisticRegression(max_iter=1000).fit(train, table["y"])
    assert (model.predict(test) == np.asarray(origins)).mean() > 0.9
    spec, _ = _fit(table, tmp_path, columns={"name": "categorical"})
    codes = transform_batch(unseen, spec, with_labels=False)["features"]
    position = spec.cardinalities.index(max(spec.cardinalities))
    assert (codes[:, position] == UNKNOWN).all()


def test_the_preprocess_console_says_the_column_is_text_and_why(tmp_path, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(preprocess.progress, "report", lambda _stage, line, **_: said.append(line))
    spec, _ = _fit(_car_table(), tmp_path)
    preprocess._report_roles(spec, SimpleNamespace(ignored={}))
    assert said[0] == "columns: 1 numeric (weight), 1 text (name)"
    assert said[1].startswith("column 'name' text (short text: ") and "made of words" in said[1]
