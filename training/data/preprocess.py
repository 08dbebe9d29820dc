"""The preprocessing stage: read, validate, split, fit train statistics, transform, write parquet.

The output directory ``<storage>/data/<fingerprint>/`` holds ``split=train|val|test/*.parquet``
with columns ``features`` (fixed-size float32 list), ``label`` (int64 class index, or a
regression's float32 label normalised by the train split's mean and std) and
``sample_id`` (int64 row hash), and ``manifest.json``, written last as the completion marker.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import shutil
import uuid
from typing import TYPE_CHECKING

from training import progress
from training.config import DataConfig, PipelineConfig
from training.data.diagnose import naming_bad_files
from training.data.inputs import input_format
from training.data.packing import pack_blocks, written_rows
from training.data.read import input_bytes, read_input, read_input_here
from training.data.roles import role_line
from training.data.rows import SPLIT, output_rows
from training.data.schema import check_schema
from training.data.summary import Stats, summarise
from training.data.text_spec import text_spec
from training.data.validate import feature_spec, left_out, validate
from training.errors import DataValidationError, StorageError
from training.manifest import SPLITS, FeatureSpec, Manifest
from training.model.trainflow_pyfunc.prompts import described
from training.platform import heap
from training.storage import (
    StorageLayout,
    delete_dir,
    exists,
    filesystem,
    is_remote,
    join,
    read_text,
    write_text_atomic,
)

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
# Rows per map_batches call: bounds worker memory for wide images.
BATCH_ROWS = 4096
# Rows per batch of a table's summary pass. Each batch's summary carries a sample of up to
# ``fitting.SAMPLE_VALUES`` values per numeric column for the medians (all of a small batch's),
# and every summary passes through the object store to this process: 4,096-row batches of the
# 10M-row ``mixed`` table sent 44 bytes per row (440 MB), 65,536-row ones 10.
SUMMARY_BATCH_ROWS = 65_536
# Seconds between "rows read" events of a long read.
PROGRESS_EVERY_S = 2.0
# Inputs smaller than this (bytes on disk) are read here once into the object store and both
# passes (summary, then transform + write) run over it. Each Ray Data execution of a parquet
# read starts and kills its own footer-reading actor and re-reads the files, and its tasks cost
# seconds of worker start-up; larger inputs stream.
CACHE_INPUT_BELOW_BYTES = 64 * 1024**2


def load_manifest(data_dir: str, endpoint_url: str | None = None) -> Manifest | None:
    """The manifest of a completed preprocessing output, or None if it is not complete."""
    uri = join(data_dir, MANIFEST_FILE)
    if not exists(uri, endpoint_url):
        return None
    try:
        return Manifest.from_json(read_text(uri, endpoint_url))
    except (ValueError, TypeError, KeyError) as exc:
        raise StorageError(
            f"{uri} is not a valid manifest ({exc}); delete {data_dir} to preprocess again"
        ) from None


def preprocess(
    config: PipelineConfig, layout: StorageLayout, fingerprint: str, files: list[str]
) -> Manifest:
    """Validate, split, normalise and write the data once per fingerprint (Ray must be running)."""
    data_dir = layout.data_dir(fingerprint)
    done = load_manifest(data_dir, layout.endpoint_url)
    if done is not None:
        log.info("reusing preprocessed data %s (manifest exists)", data_dir)
        progress.report(
            "preprocess", f"reused {sum(done.rows.values()):,} rows already preprocessed"
        )
        return done
    data = config.data
    in_endpoint = config.storage.endpoint_url
    if not files:
        raise DataValidationError(f"no input files for {data.source!r}; check data.source")
    plan = check_schema(data, files, input_format(data, files), in_endpoint)
    if input_bytes(files, in_endpoint) < CACHE_INPUT_BELOW_BYTES:
        with naming_bad_files(files, plan, in_endpoint):
            ds = read_input_here(files, plan, in_endpoint)
    else:
        ds = read_input(files, plan, in_endpoint)

    stats = Stats()
    summaries = _per_batch(
        ds, summarise, {"plan": plan, "split": data.split}, batch_size=_summary_batch_rows(plan)
    )
    every = progress.Every(PROGRESS_EVERY_S)
    with naming_bad_files(files, plan, in_endpoint):
        for row in summaries.iter_rows():
            stats.add(pickle.loads(row["summary"]))
            if every.due():
                progress.report("preprocess", f"{stats.rows:,} rows read", rows_read=stats.rows)
    task, reason, classes = validate(stats, data, plan, files, in_endpoint)
    progress.report(
        "preprocess", f"{stats.rows:,} rows read and validated", rows_validated=stats.rows
    )
    first_unlabeled = ""
    if stats.null_labels:  # only under data.missing_label: drop (validate refuses them else)
        ds, first_unlabeled = _without_unlabelled(ds, stats, files, plan, in_endpoint)
    spec, ignored = _fitted_spec(config, ds, stats, plan, classes, task)
    rows_out = _per_batch(
        ds, output_rows, {"spec": spec, "split": data.split}, udf_modifying_row_count=False
    )
    packed = spec.task == "causal_lm" and data.pack
    rows_out = _packed(rows_out, data.max_length) if packed else rows_out
    with naming_bad_files(files, plan, in_endpoint):
        _write(rows_out, data_dir, layout)

    manifest = _manifest(fingerprint, data, data_dir, files, stats, spec)
    if packed:
        _count_blocks(manifest, data.max_length, layout.endpoint_url)
    manifest.task_reason = reason
    manifest.ignored_columns = ignored
    manifest.rows_dropped_unlabeled = stats.null_labels
    manifest.first_unlabeled = first_unlabeled
    # Last: the manifest is the completion marker.
    manifest_uri = join(data_dir, MANIFEST_FILE)
    write_text_atomic(manifest_uri, manifest.to_json(), layout.endpoint_url, layout.retry_attempts)
    written = stats.rows - stats.null_labels
    log.info("preprocessed %d rows into %s; task %s (%s)", written, data_dir, task, reason)
    progress.report(
        "preprocess",
        f"{written:,} rows written; task: {task} ({reason})",
        rows_written=written,
        task=task,
    )
    return manifest


def _without_unlabelled(ds, stats: Stats, files: list[str], plan, endpoint_url: str | None):
    """(the input without its rows that have no label, where the first of them was). The
    summary already left them out of the counts, classes and fitted statistics; the transform
    and the written splits must not see them either."""
    from training.data.diagnose import locate_missing_labels
    from training.data.rows import labelled_rows

    first = locate_missing_labels(files, plan, endpoint_url) or ""
    where = f" (the first in {first})" if first else ""
    progress.report(
        "preprocess",
        f"{stats.null_labels:,} of {stats.rows:,} rows have no value in label column "
        f"{plan.label!r}{where}: dropped (data.missing_label: drop)",
        rows_dropped_unlabeled=stats.null_labels,
    )
    kept = ds.map_batches(
        labelled_rows, fn_kwargs={"label_column": plan.label}, batch_format="pyarrow"
    )
    return kept, first


def _packed(rows: ray.data.Dataset, block: int) -> ray.data.Dataset:
    """A language model's texts as blocks of ``block`` tokens (``training.data.packing``)."""
    return rows.map_batches(pack_blocks, batch_format="pyarrow", fn_kwargs={"block": block})


def _count_blocks(manifest: Manifest, block: int, endpoint_url: str | None) -> None:
    """A packed split's rows are its blocks: counted as written, and said."""
    manifest.rows = written_rows(manifest.split_uris, endpoint_url)
    blocks = ", ".join(f"{s} {n:,}" for s, n in manifest.rows.items())
    progress.report("preprocess", f"packed into blocks of {block} tokens: {blocks}")


def _report_roles(spec: FeatureSpec, plan) -> dict[str, str]:
    """The columns' roles on the preprocess line, and each column left out with its reason."""
    if not spec.column_roles:
        return {}
    ignored = left_out(spec, plan)
    progress.report("preprocess", f"columns: {role_line(spec.column_roles)}")
    for column, how in spec.datetime_found.items():
        progress.report("preprocess", f"column {column!r} datetime ({how})")
    for column, why in spec.text_found.items():
        progress.report("preprocess", f"column {column!r} text ({why})")
    for column, reason in ignored.items():
        progress.report("preprocess", f"column {column!r} not used: {reason}")
    return ignored


def _fitted_spec(config: PipelineConfig, ds, stats: Stats, plan, classes, task: str):
    """The feature spec fitted on train, and the columns left out (both said on the console)."""
    if config.model.kind == "hf":  # a text model: token ids of its one text column
        spec, ignored = text_spec(ds, stats, config, plan, classes, task)
        _report_tokens(spec, ignored)
        return spec, ignored
    spec = feature_spec(stats, config.data, plan, classes, task)
    return spec, _report_roles(spec, plan)


def _report_tokens(spec: FeatureSpec, ignored: dict[str, str]) -> None:
    """A text model's columns on the preprocess line: the text column, and each one not used."""
    tokens = spec.tokens
    progress.report(
        "preprocess",
        f"columns: {described(tokens)} as tokens (at most {tokens['max_length']}, a "
        f"vocabulary of {tokens['vocab_size']:,})",
    )
    for column, reason in ignored.items():
        progress.report("preprocess", f"column {column!r} not used: {reason}")


def _manifest(
    fingerprint: str,
    data: DataConfig,
    data_dir: str,
    files: list[str],
    stats: Stats,
    spec: FeatureSpec,
) -> Manifest:
    """What was written: where each split lies, its rows per class, and how it was made."""
    class_counts = {
        s: {str(v): stats.class_counts[s][v] for v in spec.classes if v in stats.class_counts[s]}
        for s in SPLITS
    }
    return Manifest(
        fingerprint=fingerprint,
        source=data.source,
        data_dir=data_dir,
        split_uris={s: join(data_dir, f"{SPLIT}={s}") for s in SPLITS},
        rows={s: int(stats.split_rows[s]) for s in SPLITS},
        class_counts=class_counts,
        spec=spec,
        preprocessing=data.model_dump(mode="json"),
        input_files=list(files),
    )


def _summary_batch_rows(plan) -> int:
    """Rows per batch of the summary pass: large for a table, ``BATCH_ROWS`` for images."""
    return BATCH_ROWS if plan.image else SUMMARY_BATCH_ROWS


def _per_batch(
    ds: ray.data.Dataset, fn, kwargs: dict, batch_size: int = BATCH_ROWS, **options
) -> ray.data.Dataset:
    """``fn(batch, **kwargs)`` over pandas batches of ``batch_size`` rows (lazy), on workers
    that give the heap they free back to the OS (``heap.keep_releasing``)."""
    return ds.map_batches(
        _releasing(fn), batch_format="pandas", batch_size=batch_size, fn_kwargs=kwargs, **options
    )


def _releasing(fn):
    """``fn`` (its name kept: Ray Data names the operator after it), run in a process whose
    freed heap goes back to the OS: a worker kept ~500 MiB of it after a few large blocks, idle
    until the run ends (``training.platform.heap``)."""

    @functools.wraps(fn)
    def releasing(batch, **kwargs):
        heap.keep_releasing()
        return fn(batch, **kwargs)

    return releasing


def _write(rows: ray.data.Dataset, data_dir: str, layout: StorageLayout) -> None:
    """Write the split directories: staged and renamed into place locally, in place on S3."""
    # Split directories without a manifest are leftovers of a failed attempt.
    for s in SPLITS:
        delete_dir(join(data_dir, f"{SPLIT}={s}"), layout.endpoint_url, layout.retry_attempts)
    if is_remote(data_dir):
        # No rename on S3: write in place; the manifest still comes last. Ray Data tries each
        # file again on S3's transient errors (10 times, back-off up to 32 s: DataContext's
        # retried_io_errors), so its requests keep pyarrow's quick retries: the layout's would
        # multiply with Ray Data's into a quarter of an hour before an outage is called one.
        fs, path = filesystem(data_dir, layout.endpoint_url)
        rows.write_parquet(path, partition_cols=[SPLIT], filesystem=fs)
        return
    staging = join(data_dir, f"_incoming-{uuid.uuid4().hex[:12]}")
    try:
        rows.write_parquet(staging, partition_cols=[SPLIT])
        for s in SPLITS:
            src = join(staging, f"{SPLIT}={s}")
            if os.path.isdir(src):
                os.replace(src, join(data_dir, f"{SPLIT}={s}"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
