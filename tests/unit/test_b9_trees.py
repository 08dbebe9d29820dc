"""B9's trees get the columns trainflow used, as the library takes them (benchmarks/b9_*)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.b9_vs_gbdt import MAX_CATEGORIES, tree_features, used_roles  # noqa: E402


def test_roles_follow_trainflows_and_leave_out_what_it_left_out():
    spec = SimpleNamespace(
        label_column="label",
        column_roles={
            "amount": "numeric",
            "plan": "categorical",
            "signup": "datetime",
            "customer_id": "id",
            "label": "label",
        },
    )
    manifest = SimpleNamespace(spec=spec, ignored_columns={"customer_id": "id-like"})
    assert used_roles(manifest) == {
        "amount": "numeric",
        "plan": "categorical",
        "signup": "datetime",
    }


def test_features_keep_gaps_cap_categories_and_split_dates():
    codes = [f"R{i:03d}" for i in range(300)]
    train = pd.DataFrame(
        {
            "amount": [1.5, None, 3.0] * 100,
            "region": codes,
            "signup": pd.to_datetime(["2021-03-01 12:00"] * 300),
        }
    )
    roles = {"amount": "numeric", "region": "categorical", "signup": "datetime"}
    features, categories = tree_features(train, roles)
    assert features["amount"].isna().sum() == 100  # gaps stay gaps: the trees take NaN
    assert isinstance(features["region"].dtype, pd.CategoricalDtype)
    assert len(features["region"].cat.categories) == MAX_CATEGORIES
    assert features["region"].isna().sum() == 300 - MAX_CATEGORIES
    assert features["signup.month"].iloc[0] == 3 and features["signup.weekday"].iloc[0] == 0
    assert features["signup.dayofyear"].iloc[0] == 60
    assert features["signup"].iloc[0] == pd.Timestamp("2021-03-01 12:00").timestamp()
    # the test rows get the train split's categories: an unseen value is missing
    test = pd.DataFrame({"amount": [2.0], "region": ["NEW"], "signup": [pd.NaT]})
    scored, _ = tree_features(test, roles, categories)
    assert list(scored["region"].cat.categories) == categories["region"]
    assert scored["region"].isna().all() and np.isnan(scored["signup"].iloc[0])


def test_the_exported_tables_have_the_public_ones_shapes(tmp_path):
    """The weather CSV: 1,461 days written YYYY/MM/DD, 5 kinds of weather, the dry days' fog or
    sun told by the season; the cars: one JSON array of 406 records with 8 and 6 gaps."""
    import json

    from benchmarks.b9_tables import write_cars, write_weather

    weather = pd.read_csv(write_weather(tmp_path), dtype={"date": str})
    assert len(weather) == 1_461 and weather["date"].iloc[0] == "2012/01/01"
    assert set(weather["weather"]) == {"sun", "rain", "drizzle", "fog", "snow"}
    dry = weather[weather["precipitation"] == 0]
    month = pd.to_datetime(dry["date"], format="%Y/%m/%d").dt.month
    foggy = (dry["weather"] == "fog").groupby(month.isin([10, 11])).mean()
    assert foggy[True] > 3 * foggy[False]  # only the date tells a foggy autumn day from sun
    records = json.loads(write_cars(tmp_path).read_text())
    assert isinstance(records, list) and len(records) == 406
    assert sum(r["Miles_per_Gallon"] is None for r in records) == 8
    assert sum(r["Horsepower"] is None for r in records) == 6
    assert len({r["Name"] for r in records}) > 300  # near-unique names
