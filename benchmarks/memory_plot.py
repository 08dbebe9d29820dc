"""Memory over time of whole runs: what their process trees held, sampled, as a PNG and JSON.

Written by the 10M-row scale test for docs/: per run size, the PSS summed over the
run's processes (the memory they take together; solid) and the RSS sum (shared pages counted
once per process that maps them; faint), with the limits the issue sets (8 GiB, and 1.5x the
smallest run's peak) drawn for the PSS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

GIB = 1024**3


def write_memory_over_time(
    runs: Mapping[str, Sequence[tuple]],
    out_dir: Path,
    name: str,
    limit_gib: float = 8.0,
    peak_ratio: float = 1.5,
) -> tuple[Path, Path]:
    """``runs``: {label: [(seconds, rss bytes, pss bytes, ...), ...]} in size order ->
    (png, json)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    peaks = {}
    for label, series in runs.items():
        seconds = [point[0] for point in series]
        pss = [point[2] / GIB for point in series]
        rss = [point[1] / GIB for point in series]
        peaks[label] = max(pss, default=0.0)
        (line,) = ax.plot(seconds, pss, label=f"{label}: PSS (peak {peaks[label]:.2f} GiB)")
        ax.plot(
            seconds,
            rss,
            color=line.get_color(),
            alpha=0.35,
            linewidth=0.8,
            label=f"{label}: RSS sum (peak {max(rss, default=0.0):.2f} GiB)",
        )
    first = next(iter(peaks.values()), 0.0)
    ax.axhline(limit_gib, color="red", linestyle="--", label=f"limit {limit_gib:g} GiB")
    if first:
        ax.axhline(
            peak_ratio * first,
            color="grey",
            linestyle=":",
            label=f"{peak_ratio:g}x the {next(iter(peaks))} PSS peak",
        )
    ax.set_xlabel("seconds since `trainflow run` started")
    ax.set_ylabel("memory of the run's process tree (GiB)")
    ax.set_title("Memory over time of whole pipeline runs")
    ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=110)
    data = out_dir / f"{name}.json"
    data.write_text(
        json.dumps(
            {
                label: [[t, rss, pss] for t, rss, pss, *_ in series]
                for label, series in runs.items()
            },
            indent=None,
        )
    )
    return png, data
