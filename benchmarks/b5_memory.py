"""B5: memory of the preprocessing stage, 1x vs 10x the default data (and 100x, informational),
and at real size: 1,000,000 vs 10,000,000 rows of the generated table.

While ``training.data.preprocess`` runs on the local Ray instance, a thread samples every 0.2 s
the RSS summed over this driver and every process under it (the local Ray instance's GCS,
raylet, dashboard and workers are all its descendants) and the bytes in Ray's object store
(the raylet's store stats, as ``ray memory --stats-only`` reads them). Peaks are compared
between scales; the RSS above the idle baseline taken just before each run is reported too.
At real size the figure is summed PSS (each shared page counted once over the tree: what the
processes take together), sampled once a second (reading every process's PSS costs CPU).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks import harness as h
from benchmarks.common import (
    Context,
    fresh_preprocess,
    object_store_gauge,
    source_config,
    start_ray,
    table_data,
    tabular_digits,
)
from benchmarks.memory_sampling import PeakSampler

ID = "B5"
TITLE = "memory: peak RSS (driver + Ray processes) and object-store peak, preprocessing 1x vs 10x"
TIMEOUT_S = (2400, 300)
MIB = 1024**2
_ANCHOR = "the same stage on 1x the default data"
_REAL_ANCHOR = "the same stage on 1,000,000 rows of the generated table"
FIGURES = [
    h.FigureSpec(
        ID, "rss_ratio_10x", "peak RSS sum (driver + Ray processes), 10x ÷ 1x", "<= 2", _ANCHOR
    ),
    h.FigureSpec(ID, "store_ratio_10x", "object-store peak, 10x ÷ 1x", "<= 2", _ANCHOR),
    h.FigureSpec(
        ID, "rss_above_idle_ratio_10x", "peak RSS above the idle baseline, 10x ÷ 1x", "—", _ANCHOR
    ),
    h.FigureSpec(ID, "rss_peak_1x_mib", "peak RSS sum, 1x (MiB)", "—", "—"),
    h.FigureSpec(ID, "rss_peak_10x_mib", "peak RSS sum, 10x (MiB)", "—", "—"),
    h.FigureSpec(ID, "store_peak_10x_mib", "object-store peak, 10x (MiB)", "—", "—"),
    h.FigureSpec(
        ID,
        "pss_ratio_real",
        "peak PSS sum, 10M ÷ 1M rows (generated table)",
        "<= 1.5",
        _REAL_ANCHOR,
    ),
    h.FigureSpec(ID, "store_ratio_real", "object-store peak, 10M ÷ 1M rows", "—", _REAL_ANCHOR),
    h.FigureSpec(ID, "pss_peak_1m_mib", "peak PSS sum, 1M rows (MiB)", "—", "—"),
    h.FigureSpec(ID, "pss_peak_10m_mib", "peak PSS sum, 10M rows (MiB)", "—", "—"),
    h.FigureSpec(ID, "store_peak_10m_mib", "object-store peak, 10M rows (MiB)", "—", "—"),
]


def _settle_store(gauge, timeout_s: float = 15.0) -> float | None:
    """Wait until the object store has released the previous run's blocks (or ``timeout_s``).

    Ray frees an object once the last reference is gone, which for blocks held by Ray Data's
    reference cycles means after a garbage collection: without this, the previous (larger)
    scale's blocks were still counted in the next run's peak.
    """
    deadline = time.monotonic() + timeout_s
    used = gauge()
    while used is not None and used > 1 * MIB and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.2)
        used = gauge()
    return used


def _arm(ctx: Context, config, gauge, interval: float):
    def run(rep: int) -> dict[str, Any]:
        store_at_start = _settle_store(gauge)
        idle = PeakSampler(interval=interval, extra=gauge)
        idle.sample()
        baseline_rss, baseline_store = idle.peak_rss, idle.peak_extra or 0.0
        with PeakSampler(interval=interval, extra=gauge) as sampler:
            manifest, seconds, _ = fresh_preprocess(config, ctx.scratch("out"))
        return {
            "rows": sum(manifest.rows.values()),
            "seconds": seconds,
            "peak_rss_mib": sampler.peak_rss / MIB,
            "peak_pss_mib": sampler.peak_pss / MIB,
            "sampler_cpu_s": round(sampler.cpu_seconds, 2),
            "baseline_rss_mib": baseline_rss / MIB,
            "rss_above_idle_mib": (sampler.peak_rss - baseline_rss) / MIB,
            "peak_store_mib": (sampler.peak_extra or 0.0) / MIB,
            "baseline_store_mib": baseline_store / MIB,
            "store_at_start_mib": None if store_at_start is None else store_at_start / MIB,
            "peak_processes": sampler.peak_procs,
            "samples_taken": len(sampler.series),
            "series_mib": [
                (t, round(r / MIB, 1), None if s is None else round(s / MIB, 2))
                for t, r, _, s in sampler.thin_series(40)
            ],
        }

    return run


def run(ctx: Context) -> h.Outcome:
    scales = ctx.pick([1, 10, 100], [1, 10])
    reps = ctx.reps(3, 1)
    interval = 0.2
    ray = start_ray(4)
    gauge = object_store_gauge()
    data_dir = ctx.scratch("data")
    configs = {scale: source_config(tabular_digits(data_dir, scale)) for scale in scales}
    # Warm-up (not measured): the first run starts Ray's worker processes; every measured run
    # then finds the same warm pool, whichever scale it is.
    fresh_preprocess(configs[scales[0]], ctx.scratch("warm"))
    arms = {f"x{scale}": _arm(ctx, configs[scale], gauge, interval) for scale in scales}
    samples = h.run_alternating(arms, reps, label=ID)
    real_rows = ctx.pick([1_000_000, 10_000_000], [20_000, 200_000])
    real = {
        f"rows{rows}": _arm(ctx, source_config(table_data(data_dir, rows)), gauge, 1.0)
        for rows in real_rows
    }
    samples.update(h.run_alternating(real, reps, label=f"{ID} real size"))

    def col(scale: int, key: str) -> list[float]:
        return h.pluck(samples[f"x{scale}"], key)

    figures = [
        h.Figure(
            "rss_ratio_10x",
            "peak RSS sum (driver + Ray processes), 10x ÷ 1x",
            "x",
            h.paired_ratios(col(10, "peak_rss_mib"), col(1, "peak_rss_mib")),
            anchor=_ANCHOR,
            target=h.Target("<=", 2.0, "<= 2"),
        ),
        h.Figure(
            "store_ratio_10x",
            "object-store peak, 10x ÷ 1x",
            "x",
            h.paired_ratios(col(10, "peak_store_mib"), col(1, "peak_store_mib")),
            anchor=_ANCHOR,
            target=h.Target("<=", 2.0, "<= 2"),
        ),
        h.Figure(
            "rss_above_idle_ratio_10x",
            "peak RSS above the idle baseline, 10x ÷ 1x",
            "x",
            h.paired_ratios(col(10, "rss_above_idle_mib"), col(1, "rss_above_idle_mib")),
            anchor=_ANCHOR,
        ),
    ]
    for scale in scales:
        figures += [
            h.Figure(
                f"rss_peak_{scale}x_mib",
                f"peak RSS sum, {scale}x (MiB)",
                "MiB",
                col(scale, "peak_rss_mib"),
            ),
            h.Figure(
                f"rss_above_idle_{scale}x_mib",
                f"peak RSS above idle, {scale}x (MiB)",
                "MiB",
                col(scale, "rss_above_idle_mib"),
            ),
            h.Figure(
                f"store_peak_{scale}x_mib",
                f"object-store peak, {scale}x (MiB)",
                "MiB",
                col(scale, "peak_store_mib"),
            ),
        ]
    small, large = (samples[f"rows{rows}"] for rows in real_rows)
    figures += [
        h.Figure(
            "pss_ratio_real",
            f"peak PSS sum, {real_rows[1]:,} ÷ {real_rows[0]:,} rows (generated table)",
            "x",
            h.paired_ratios(h.pluck(large, "peak_pss_mib"), h.pluck(small, "peak_pss_mib")),
            anchor=_REAL_ANCHOR,
            target=h.Target("<=", 1.5, "<= 1.5"),
        ),
        h.Figure(
            "store_ratio_real",
            f"object-store peak, {real_rows[1]:,} ÷ {real_rows[0]:,} rows",
            "x",
            h.paired_ratios(h.pluck(large, "peak_store_mib"), h.pluck(small, "peak_store_mib")),
            anchor=_REAL_ANCHOR,
        ),
        h.Figure(
            "pss_peak_1m_mib",
            f"peak PSS sum, {real_rows[0]:,} rows (MiB)",
            "MiB",
            h.pluck(small, "peak_pss_mib"),
        ),
        h.Figure(
            "pss_peak_10m_mib",
            f"peak PSS sum, {real_rows[1]:,} rows (MiB)",
            "MiB",
            h.pluck(large, "peak_pss_mib"),
        ),
        h.Figure(
            "store_peak_10m_mib",
            f"object-store peak, {real_rows[1]:,} rows (MiB)",
            "MiB",
            h.pluck(large, "peak_store_mib"),
        ),
    ]
    if 100 in scales:
        figures.append(
            h.Figure(
                "rss_ratio_100x",
                "peak RSS sum, 100x ÷ 1x",
                "x",
                h.paired_ratios(col(100, "peak_rss_mib"), col(1, "peak_rss_mib")),
                anchor=_ANCHOR,
            )
        )
    return h.Outcome(
        figures=figures,
        samples=samples,
        params={
            "scales": scales,
            "rows": {f"{s}x": samples[f"x{s}"][0]["rows"] for s in scales},
            "reps": reps,
            "interval_s": interval,
            "ray_num_cpus": 4,
            "ray_start_s": ray.get("_start_s"),
            "warm_up": "one unmeasured 1x run first",
            "real_size_rows": real_rows,
            "real_size_interval_s": 1.0,
        },
        notes=[
            "RSS sums count shared pages (object-store shared memory, shared libraries) once per "
            "process that maps them: an over-estimate of unique memory, comparable between runs",
            "object store: raylet store stats (object_store_bytes_used), sampled with the RSS; "
            "each run starts once the store has released the previous run's blocks (<= 1 MiB "
            "left, or 15 s)",
        ],
    )
