"""A table's fitted transform state, from the summary of the training split: the final column
roles (string columns found id-like are left out, and said so; free text is hashed), medians and
missing flags, vocabularies, datetime years, the text columns, and the per-position
mean/std/cardinality."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.config import DataConfig
from training.data import drift
from training.data.fitting import TableFit, vocabulary
from training.data.roles import FEATURE_ROLES, REASONS, UNSUPPORTED
from training.data.schema import Plan
from training.errors import DataValidationError
from training.model.trainflow_pyfunc.transform_steps import CYCLES, RESERVED, datetime_width


@dataclass
class TableState:
    """The spec fields of a table's transform, and the reasons columns are left out."""

    roles: dict[str, str]
    ignored: dict[str, str]
    fields: dict[str, Any] = field(default_factory=dict)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)


def _std(n: float, m2: float) -> float:
    std = math.sqrt(m2 / n) if n > 0 else 0.0
    return std if std > 0 else 1.0  # a constant column: centred, not divided by 0


def _check_not_empty(fit: TableFit, plan: Plan) -> None:
    """A column empty in every training row is a mistake to name, not a feature."""
    numeric = plan.features or []
    n = np.asarray(fit.numeric[0]) if fit.numeric is not None else np.zeros(len(numeric))
    empty = [c for c, count in zip(numeric, n.tolist(), strict=True) if count == 0]
    empty += [c for c, r in plan.hash_roles.items() if r == "categorical" and not fit.counts.get(c)]
    empty += [c for c, (count, _, _) in fit.years.items() if float(np.asarray(count)[0]) == 0]
    if empty:
        raise DataValidationError(
            f"column(s) {empty[:10]} are empty in every training row; leave them out "
            f"(data.columns: {{{empty[0]}: ignore}}) or fill them"
        )


@dataclass
class Dates:
    """The format each text datetime column is parsed by, and the string columns found
    datetime by their values (column -> how the format reads, said on the console)."""

    formats: dict[str, str] = field(default_factory=dict)
    found: dict[str, str] = field(default_factory=dict)


def _dates(fit: TableFit, data: DataConfig, plan: Plan) -> Dates:
    """Dates before id-like: a column of distinct dates is a season, not a code. A declared
    datetime column whose values fit no format is parsed as it always was (any date pandas
    reads), unless a format is declared for it: then a value it cannot read is an error."""
    dates = Dates()
    for column, role in plan.hash_roles.items():
        chosen = fit.date_format(column) if column in plan.date_formats else None
        declared = data.date_formats.get(column)
        if role == "datetime" and declared and chosen is None and column in fit.dates:
            raise DataValidationError(
                f"datetime column {column!r} holds training values that data.date_formats' "
                f"{declared!r} cannot read; fix the format or the values"
            )
        if chosen is None:
            continue
        dates.formats[column] = chosen[0]
        if role == "categorical":
            dates.found[column] = chosen[1]
    return dates


def _final_roles(
    fit: TableFit, data: DataConfig, plan: Plan, dates: Dates
) -> tuple[dict, dict, dict]:
    """(column -> role, column -> why it is not used, text column found by its values -> why):
    the plan's roles from the types, a string column not declared turned datetime, id-like or
    text by its values."""
    roles = dict(plan.hash_roles)
    ignored = dict(plan.ignored)
    texts: dict[str, str] = {}
    for column, role in roles.items():
        if column in dates.found:
            roles[column] = "datetime"
            continue
        if role != "categorical" or data.columns.get(column):
            continue
        found = fit.string_role(column, data.max_categories)
        if found:
            roles[column] = found.role
            if found.role in REASONS:
                ignored[column] = REASONS[found.role]
            if found.role == "text":
                texts[column] = found.why
    for column, reason in plan.ignored.items():
        roles[column] = "ignore" if reason == REASONS["ignore"] else UNSUPPORTED
    if not any(r in FEATURE_ROLES for r in roles.values()):
        raise DataValidationError(
            f"no feature column is left: {ignored}; declare a column's role in data.columns"
        )
    return roles, ignored, texts


def table_state(fit: TableFit, data: DataConfig, plan: Plan) -> TableState:
    """The fitted state of a table (train split only), plain data for the spec."""
    _check_not_empty(fit, plan)
    dates_found = _dates(fit, data, plan)
    roles, ignored, texts_found = _final_roles(fit, data, plan, dates_found)
    used = [c for c, r in roles.items() if r in FEATURE_ROLES]
    numeric = plan.features or []
    n, mean, m2 = (np.asarray(v, dtype=np.float64) for v in fit.numeric)
    gaps = np.asarray(fit.gaps).tolist()
    state = TableState(roles, ignored)
    state.mean = [float(v) for v in mean]
    state.std = [_std(a, b) for a, b in zip(n.tolist(), m2.tolist(), strict=True)]
    impute = data.missing == "impute"
    indicators = [c for c, g in zip(numeric, gaps, strict=True) if g and impute]
    state.mean += [0.0] * len(indicators)
    state.std += [1.0] * len(indicators)
    categories = {
        c: vocabulary(fit.counts.get(c, {}), data.max_categories)
        for c in used
        if roles[c] == "categorical"
    }
    state.mean += [0.0] * len(categories)
    state.std += [1.0] * len(categories)
    dates = [c for c in used if roles[c] == "datetime"]
    years = {}
    date_width = datetime_width({"datetime_cycles": CYCLES})
    for column in dates:
        count, year_mean, year_m2 = _year_moments(fit, column, dates_found.formats.get(column))
        years[column] = year_mean
        state.mean += [year_mean] + [0.0] * (date_width - 1)
        state.std += [_std(count, year_m2)] + [1.0] * (date_width - 1)
    texts = [c for c in used if roles[c] == "text"]
    # Hashed text passes through the normalisation: mean 0, std 1 keep its zeros zeros.
    state.mean += [0.0] * (data.text_features * len(texts))
    state.std += [1.0] * (data.text_features * len(texts))
    cards = [len(v) + RESERVED for v in categories.values()]
    width = len(numeric) + len(indicators)
    after = date_width * len(dates) + data.text_features * len(texts)
    state.fields = {
        "medians": [fit.median(i) for i in range(len(numeric))] if impute else [],
        "indicator_columns": indicators,
        "categories": categories,
        "datetime_columns": dates,
        "datetime_years": years,
        "datetime_formats": {c: f for c, f in dates_found.formats.items() if c in dates},
        "datetime_found": {c: how for c, how in dates_found.found.items() if c in dates},
        "datetime_cycles": list(CYCLES),
        "column_roles": roles,
        "text_columns": texts,
        "text_found": texts_found,
        "text_features": data.text_features if texts else 0,
        "cardinalities": [0] * width + cards + [0] * after,
        "drift_reference": drift_reference(fit, numeric, list(categories)),
    }
    return state


def _year_moments(fit: TableFit, column: str, fmt: str | None) -> tuple[float, float, float]:
    """(count, mean, M2) of a datetime column's train years: as its format reads them, where
    it has one."""
    moments = fit.dates[column][fmt] if fmt else fit.years[column]
    return tuple(float(np.asarray(v)[0]) for v in moments)


def drift_reference(fit: TableFit, numeric: list[str], categorical: list[str]) -> dict[str, Any]:
    """The train split as a later run's drift check reads it (``training.data.drift``): from
    the partials already added up, so no pass over the rows is added."""
    present = np.asarray(fit.numeric[0], dtype=np.float64).tolist() if fit.numeric else []
    gaps = np.asarray(fit.gaps).tolist() if fit.gaps is not None else []
    return {
        "numeric": {
            column: drift.numeric_reference(fit.samples[i][1], present[i], gaps[i])
            for i, column in enumerate(numeric[: drift.MAX_NUMERIC_COLUMNS])
        },
        "categorical": {
            c: drift.categorical_reference(fit.counts.get(c, {}), fit.missing.get(c, 0))
            for c in categorical
        },
    }
