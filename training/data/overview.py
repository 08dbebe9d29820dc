"""What a run would make of a table, without running one (``trainflow inspect``).

The input is read here with pyarrow (no Ray), in batches of the preprocess stage's summary size,
and goes through the stage's own functions: the files (``resolve_inputs``, ``input_format``), the
footer check and the plan (``check_schema``), the summary (``summarise``), the checks, task and
classes (``validate``) and the fitted roles (``feature_spec``). Nothing is written under the
storage root. What it adds is only counting: each column's missing values over every row.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pandas as pd

from training.config import PipelineConfig
from training.data.dates import readable
from training.data.diagnose import naming_bad_files
from training.data.inputs import input_format, resolve_inputs
from training.data.preprocess import SUMMARY_BATCH_ROWS
from training.data.read import input_batches
from training.data.schema import Plan, check_schema
from training.data.summary import Stats, summarise
from training.data.task import REGRESSION
from training.data.validate import feature_spec, left_out, validate
from training.manifest import SPLITS, FeatureSpec

#: Classes listed one by one; more are counted.
CLASSES_LISTED = 12


@dataclass(frozen=True)
class ColumnView:
    """One column: its role (or ``label``, ``ignored``), why, and its missing values (None: the
    column is not read)."""

    name: str
    role: str
    detail: str
    missing: int | None


@dataclass
class Overview:
    """The table as a run would take it: files, columns, task, classes, splits."""

    source: str
    files: int
    fmt: str
    rows: int = 0
    columns: list[ColumnView] = field(default_factory=list)
    task: str = ""
    task_reason: str = ""
    classes: list[tuple[str, int]] = field(default_factory=list)
    label_stats: tuple[float, float] | None = None  # a regression's label mean and std
    splits: dict[str, int] = field(default_factory=dict)
    unlabeled_dropped: int = 0
    note: str = ""  # what an input of another kind (image files) is, in words


def overview(config: PipelineConfig) -> Overview:
    """The overview of ``config.data``; a DataValidationError where a run would refuse it."""
    data = config.data
    endpoint = config.storage.endpoint_url
    files = resolve_inputs(data, endpoint)
    fmt = input_format(data, files)
    plan = check_schema(data, files, fmt, endpoint)
    view = Overview(data.source, len(files), fmt)
    if plan.image:
        view.note = _image_note(plan)
        return view
    stats, missing = _summary(files, plan, config, endpoint)
    task, reason, classes = validate(stats, data, plan, files, endpoint)
    view.rows, view.task, view.task_reason = stats.rows, task, reason
    view.splits = {s: int(stats.split_rows[s]) for s in SPLITS}
    view.unlabeled_dropped = stats.null_labels
    view.classes = _class_rows(stats, classes)
    if task == REGRESSION:
        n, mean, m2 = stats.label_train
        view.label_stats = (mean, (m2 / n) ** 0.5)
    if config.model.kind == "hf":
        view.columns = _text_model_columns(plan, stats, config, missing)
    else:
        spec = feature_spec(stats, data, plan, classes, task)
        view.columns = _table_columns(spec, plan, stats, config, missing)
    label = plan.label
    view.columns.append(ColumnView(label, "label", _label_detail(view), missing.get(label)))
    return view


def _summary(files: list[str], plan: Plan, config: PipelineConfig, endpoint: str | None):
    """(the summary a run's first pass makes of the input, missing values per column)."""
    stats = Stats()
    missing: dict[str, int] = dict.fromkeys(plan.columns, 0)
    with naming_bad_files(files, plan, endpoint):
        for batch in rebatched(input_batches(files, plan, endpoint), SUMMARY_BATCH_ROWS):
            stats.add(pickle.loads(summarise(batch, plan, config.data.split)["summary"][0]))
            for column, n in batch.isna().sum().items():
                missing[column] += int(n)
    return stats, missing


def rebatched(frames: Iterable[pd.DataFrame], rows: int) -> Iterator[pd.DataFrame]:
    """The frames' rows in order, as frames of ``rows`` rows (the last one shorter): the batches
    the summary pass sees, whatever blocks the files were read in."""
    held: list[pd.DataFrame] = []
    count = 0
    for frame in frames:
        held.append(frame)
        count += len(frame)
        while count >= rows:
            joined = pd.concat(held, ignore_index=True)
            yield joined.iloc[:rows].reset_index(drop=True)
            rest = joined.iloc[rows:].reset_index(drop=True)
            held, count = [rest], len(rest)
    if count:
        yield pd.concat(held, ignore_index=True)


def _class_rows(stats: Stats, classes: list) -> list[tuple[str, int]]:
    """(class, rows with it) over every split, most rows first."""
    totals = {str(v): sum(stats.class_counts[s].get(v, 0) for s in SPLITS) for v in classes}
    return sorted(totals.items(), key=lambda kv: -kv[1])


def _label_detail(view: Overview) -> str:
    dropped = view.unlabeled_dropped
    gone = f"; {dropped:,} without a label dropped (data.missing_label: drop)" if dropped else ""
    if view.task == REGRESSION:
        return f"a number to predict{gone}"
    if view.task == "causal_lm":
        from training.data.text_spec import LABEL_NOT_USED

        return LABEL_NOT_USED
    return f"{len(view.classes)} classes{gone}"


def _table_columns(
    spec: FeatureSpec, plan: Plan, stats: Stats, config: PipelineConfig, missing: dict
) -> list[ColumnView]:
    """Each feature column with its fitted role and why, in the table's order."""
    ignored = left_out(spec, plan)
    declared = config.data.columns
    out = []
    for column, role in spec.column_roles.items():
        if column in ignored:
            out.append(ColumnView(column, "ignored", ignored[column], missing.get(column)))
            continue
        detail = _role_detail(column, role, spec, plan, stats)
        if column in declared:
            detail = "; ".join(x for x in ("declared in data.columns", detail) if x)
        out.append(ColumnView(column, role, detail, missing.get(column)))
    return out


def _role_detail(column: str, role: str, spec: FeatureSpec, plan: Plan, stats: Stats) -> str:
    """Why a used column has its role, and what the run makes of it."""
    if role == "numeric":
        if column in spec.indicator_columns:
            median = spec.medians[(plan.features or []).index(column)]
            return f"gaps: train median {median:.6g} + a missing flag"
        return ""
    if role == "categorical":
        return _categories(len(stats.table.counts.get(column, {})), len(spec.categories[column]))
    if role == "datetime":
        return _date_detail(column, spec, plan)
    if role == "text":
        return f"free text, hashed into {spec.text_features:,} features"
    return ""


def _categories(seen: int, kept: int) -> str:
    """``5 values``, or ``812 values, the 100 most frequent kept (data.max_categories)``."""
    text = f"{seen:,} values in train"
    return text if kept >= seen else f"{text}, the {kept:,} most frequent kept"


def _date_detail(column: str, spec: FeatureSpec, plan: Plan) -> str:
    """The format a date column is read by, day or month first, or its type's dates."""
    fmt = spec.datetime_formats.get(column)
    if fmt is None:
        return "timestamps by type" if plan.roles.get(column) == "datetime" else ""
    how = spec.datetime_found.get(column) or readable(fmt)
    if "%d" in fmt and "%m" in fmt and "assumed" not in how:
        how += ", day first" if fmt.index("%d") < fmt.index("%m") else ", month first"
    return f"text as {how}"


def _text_model_columns(
    plan: Plan, stats: Stats, config: PipelineConfig, missing: dict
) -> list[ColumnView]:
    """A text model's columns: its text column(s) as tokens, every other left out."""
    from training.data.text_spec import NOT_USED, token_sources

    sources = token_sources(plan, stats, config)
    out = []
    for column in plan.hash_roles:
        used = column in sources
        role, detail = ("text", "tokens (model.kind=hf)") if used else ("ignored", NOT_USED)
        out.append(ColumnView(column, role, detail, missing.get(column)))
    out += [ColumnView(c, "ignored", why, None) for c, why in plan.ignored.items()]
    return out


def _image_note(plan: Plan) -> str:
    """An image input in words (its rows are images: no table columns to give roles)."""
    shape = "x".join(map(str, plan.image_shape or []))
    if plan.image_root is not None:
        return f"image paths in column {plan.image!r}, resized to {shape}; label {plan.label!r}"
    if plan.fmt == "images":
        return f"a folder of image files, resized to {shape}; the class folder is the label"
    return f"images in column {plan.image!r}; label {plan.label!r}"
