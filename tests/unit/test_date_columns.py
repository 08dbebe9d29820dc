"""Dates as people write them: a text column whose training values all fit one format is
datetime (day-first or month-first decided by the values, the ambiguous case said), the format
travels in the spec so serving parses as training did (a value that does not fit is a gap), day
of year is a cycle, and a spec from before formats and day of year transforms as it did."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_table_columns import _fit, _table

from training.config.overrides import load_config
from training.data.rows import hash_roles, transform_batch
from training.errors import ConfigError
from training.model.trainflow_pyfunc.transform import TransformError
from training.model.trainflow_pyfunc.transform_steps import datetime_parts, datetime_width

DAYS = pd.date_range("2011-01-01", periods=400, freq="D")


def _with_dates(values: list[str]) -> pd.DataFrame:
    return _table(len(values)).assign(d=values)


@pytest.mark.parametrize(
    ("values", "fmt"),
    [
        (DAYS.strftime("%Y-%m-%d"), "ISO8601"),
        (DAYS.strftime("%Y-%m-%dT10:00:00Z"), "ISO8601"),
        (DAYS.strftime("%Y-%m-%d %H:%M"), "ISO8601"),
        (DAYS.strftime("%Y/%m/%d"), "%Y/%m/%d"),
        (DAYS.strftime("%d.%m.%Y"), "%d.%m.%Y"),
        (DAYS.strftime("%m/%d/%Y"), "%m/%d/%Y"),  # Jan 13: a second field above 12
        (DAYS.strftime("%d/%m/%Y"), "%d/%m/%Y"),  # Jan 13: a first field above 12
        (DAYS.strftime("%d/%m/%Y %H:%M"), "%d/%m/%Y %H:%M"),
        (DAYS.strftime("%m/%d/%Y %H:%M:%S"), "%m/%d/%Y %H:%M:%S"),
    ],
)
def test_a_text_column_of_one_date_format_is_datetime(tmp_path, values, fmt):
    spec, _ = _fit(_with_dates(list(values)), tmp_path)
    assert spec.column_roles["d"] == "datetime"  # distinct short strings: id-like, were it not
    assert spec.datetime_formats == {"d": fmt}
    assert "assumed" not in spec.datetime_found["d"]
    assert spec.datetime_years["d"] == pytest.approx(2011.09, abs=0.05)  # 365 days, then 35


def test_slash_dates_with_no_day_above_12_are_month_first_and_say_so(tmp_path):
    twelve = range(1, 13)
    days = [f"{m:02d}/{d:02d}/{y}" for y in range(2010, 2014) for m in twelve for d in twelve]
    days = days[:400]
    spec, _ = _fit(_with_dates(days), tmp_path)
    assert spec.datetime_formats == {"d": "%m/%d/%Y"}
    assert spec.datetime_found == {"d": "MM/DD/YYYY assumed: no day above 12"}


def test_a_declared_format_decides_where_the_values_cannot(tmp_path):
    days = [f"{d:02d}/{m:02d}/2012" for m in range(1, 13) for d in range(1, 13)] * 3
    spec, batch = _fit(_with_dates(days), tmp_path, date_formats={"d": "%d/%m/%Y"})
    assert spec.datetime_formats == {"d": "%d/%m/%Y"}
    assert spec.datetime_found == {"d": "DD/MM/YYYY"}


@pytest.mark.parametrize(
    "values",
    [
        # ISO and slashes: two formats in one column.
        [*DAYS[:200].strftime("%Y-%m-%d"), *DAYS[200:].strftime("%Y/%m/%d")],
        # A first field above 12 and a second field above 12: neither day-first nor month-first.
        [*DAYS[:200].strftime("%d/%m/%Y"), *DAYS[200:].strftime("%m/%d/%Y")],
    ],
)
def test_a_column_mixing_formats_is_not_datetime(tmp_path, values):
    spec, _ = _fit(_with_dates(values), tmp_path)
    assert spec.column_roles["d"] == "id-like" and not spec.datetime_formats


def test_eight_digits_are_a_date_only_when_declared(tmp_path):
    values = list(DAYS.strftime("%Y%m%d"))
    spec, _ = _fit(_with_dates(values), tmp_path)
    assert spec.column_roles["d"] == "id-like"
    spec, _ = _fit(_with_dates(values), tmp_path, columns={"d": "datetime"})
    assert spec.column_roles["d"] == "datetime" and spec.datetime_formats == {"d": "%Y%m%d"}
    assert spec.datetime_found == {}  # declared: not found by its values


def test_a_found_date_column_is_hashed_by_its_text_as_the_plan_read_it(tmp_path):
    spec, _ = _fit(_with_dates(list(DAYS.strftime("%Y/%m/%d"))), tmp_path)
    assert hash_roles(spec)["d"] == "categorical"
    assert hash_roles(spec)["when"] == "datetime"


def test_serving_reads_an_unparsable_date_as_a_gap(tmp_path):
    spec, batch = _fit(_with_dates(list(DAYS.strftime("%Y/%m/%d"))), tmp_path)
    served = batch.copy()
    served.loc[:2, "d"] = ["2011-01-01", "not a date", None]
    out = transform_batch(served, spec, with_labels=False)["features"]
    width = datetime_width(spec.to_dict())
    assert spec.datetime_cycles == ["month", "weekday", "hour", "dayofyear"] and width == 9
    start = len(spec.mean) - width * 2 - spec.text_features * len(spec.text_columns) + width
    assert spec.datetime_columns == ["when", "d"]
    gap = np.zeros(width, dtype=np.float32)
    gap[0] = (spec.datetime_years["d"] - spec.mean[start]) / spec.std[start]
    for row in range(3):  # another format, not a date, missing: all three a gap
        np.testing.assert_allclose(out[row, start : start + width], gap, atol=1e-6)
    assert np.abs(out[3, start + 1 : start + width]).sum() > 0  # a parsed date has its cycles


def test_a_declared_format_the_training_values_do_not_fit_is_an_error(tmp_path):
    from training.errors import DataValidationError

    values = list(DAYS.strftime("%m/%d/%Y"))
    with pytest.raises(DataValidationError, match=r"'d' holds training values .*'%d/%m/%Y'"):
        _fit(
            _with_dates(values), tmp_path, columns={"d": "datetime"}, date_formats={"d": "%d/%m/%Y"}
        )


def test_an_older_spec_keeps_its_seven_positions_and_its_parsing():
    frame = pd.DataFrame({"d": ["2012-01-01", "2012-07-01 10:00"]})
    old = {"datetime_years": {"d": 2012.0}}  # no formats, no cycles: a model from before
    parts = datetime_parts(frame, ["d"], old)
    assert parts.shape == (2, 7) and datetime_width(old) == 7
    new = datetime_parts(frame, ["d"], {**old, "datetime_cycles": ["month", "weekday", "hour"]})
    np.testing.assert_array_equal(parts, new)
    with pytest.raises(TransformError, match="not a date"):
        datetime_parts(pd.DataFrame({"d": ["not a date"]}), ["d"], old)


def test_day_of_year_tells_the_seasons_apart_and_closes_the_year():
    frame = pd.DataFrame({"d": ["2012/01/01", "2012/07/01", "2012/12/31", "2013/01/01"]})
    spec = {
        "datetime_cycles": ["month", "weekday", "hour", "dayofyear"],
        "datetime_formats": {"d": "%Y/%m/%d"},
    }
    parts = datetime_parts(frame, ["d"], spec)
    assert parts.shape == (4, 9)
    day = parts[:, 7:9]  # sin, cos of the day of year
    jan1, jul1, dec31, next_jan1 = day
    assert np.linalg.norm(jan1 - jul1) > 1.9  # opposite sides of the year
    assert np.linalg.norm(dec31 - next_jan1) < 0.05  # the year closes on itself
    np.testing.assert_allclose(jan1, next_jan1)


@pytest.mark.parametrize("fmt", ["%Q/%m", "dd/mm/yyyy"])
def test_a_date_format_that_cannot_read_dates_is_one_config_error(fmt):
    with pytest.raises(ConfigError, match=r"data.date_formats.*is not a date format"):
        load_config(None, [f"data.date_formats={{d: '{fmt}'}}"])


def test_a_date_format_for_any_column_is_accepted():
    config = load_config(None, ["data.date_formats={d: '%d/%m/%Y', x: ISO8601}"])
    assert config.data.date_formats == {"d": "%d/%m/%Y", "x": "ISO8601"}
