"""Which text columns hold dates, and in which one format: training's side of the datetime
role (the shipped transform only parses, by the format chosen here).

A text column is a date column when every training value (present) parses under one format of
``INFERRED``; ``YYYYMMDD`` only where the column is declared datetime (eight digits are as often
a code), and a ``data.date_formats`` format alone where one is declared. Day-first and
month-first slash dates are two formats: a day above 12 rules one out, so the values decide;
where both still fit, month-first is assumed and said. Parsing is vectorised: each format is
tried on a few distinct values first, then on every distinct value of a batch.
"""

from __future__ import annotations

import pandas as pd

from training.model.trainflow_pyfunc.transform_steps import ISO, parse_as

_TIMES = ("", " %H:%M", " %H:%M:%S")
_DAYS = ("%Y/%m/%d", "%d.%m.%Y", "%m/%d/%Y", "%d/%m/%Y")
#: The formats a text column is tried under, in order of preference (month-first before its
#: day-first twin: the pick where the values cannot tell them apart).
INFERRED = (ISO, *(day + time for day in _DAYS for time in _TIMES))
#: Tried only for a column declared datetime.
DECLARED_ONLY = ("%Y%m%d",)
#: Distinct values a format is tried on before all of them (most text is no date: cheap no).
PROBE = 20
#: ISO 8601 as pandas reads it also takes "2012" and "20120101": a date column starts so.
_ISO_START = r"\d{4}-\d{2}-\d{2}"


def candidate_formats(declared_format: str | None, declared_datetime: bool) -> tuple[str, ...]:
    """The formats a column is tried under: its declared one alone, else the inferred ones."""
    if declared_format:
        return (declared_format,)
    return INFERRED + (DECLARED_ONLY if declared_datetime else ())


def fitting_formats(values: pd.Series, formats: tuple[str, ...]) -> list[str] | None:
    """The formats under which every present value parses (None: no value to tell by)."""
    distinct = pd.Series(values.dropna().astype(str).unique())
    if not len(distinct):
        return None
    probe = distinct[:PROBE]
    survivors = [fmt for fmt in formats if _parses_all(probe, fmt)]
    return [fmt for fmt in survivors if _parses_all(distinct, fmt)]


def _parses_all(values: pd.Series, fmt: str) -> bool:
    if fmt == ISO and not values.str.match(_ISO_START).all():
        return False
    return bool(parse_as(values, fmt).notna().all())


def chosen_format(fits: list[str]) -> tuple[str, str] | None:
    """(the format, how it reads on the console) of the formats that fit a column's values,
    or None when none does. Formats are tried in order, so the first is the preferred."""
    if not fits:
        return None
    fmt = fits[0]
    twin = _day_first(fmt)
    if twin and twin in fits:
        return fmt, f"{readable(fmt)} assumed: no day above 12"
    return fmt, readable(fmt)


def _day_first(fmt: str) -> str | None:
    """A month-first slash format's day-first twin (None for any other format)."""
    return "%d/%m/%Y" + fmt[len("%m/%d/%Y") :] if fmt.startswith("%m/%d/%Y") else None


def readable(fmt: str) -> str:
    """``%d/%m/%Y %H:%M`` -> ``DD/MM/YYYY HH:MM`` (as people write formats)."""
    if fmt == ISO:
        return "ISO 8601"
    names = {"%Y": "YYYY", "%m": "MM", "%d": "DD", "%H": "HH", "%M": "MM", "%S": "SS"}
    for code, name in names.items():
        fmt = fmt.replace(code, name)
    return fmt
