"""Memory over time of whole runs: the RSS their process trees held, sampled, as a PNG and JSON.

Written by the 10M-row scale test (issue 16) for docs/: one line per run size, with the limits
the issue sets (8 GiB, and 1.5x the smallest run's peak).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

GIB = 1024**3


def write_memory_over_time(
    runs: Mapping[str, Sequence[tuple[float, int, float | None]]],
    out_dir: Path,
    name: str,
    limit_gib: float = 8.0,
    peak_ratio: float = 1.5,
) -> tuple[Path, Path]:
    """``runs``: {label: [(seconds, rss bytes, extra), ...]} in size order -> (png, json)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    peaks = {}
    for label, series in runs.items():
        seconds = [point[0] for point in series]
        gib = [point[1] / GIB for point in series]
        peaks[label] = max(gib, default=0.0)
        ax.plot(seconds, gib, label=f"{label} (peak {peaks[label]:.2f} GiB)")
    first = next(iter(peaks.values()), 0.0)
    ax.axhline(limit_gib, color="red", linestyle="--", label=f"limit {limit_gib:g} GiB")
    if first:
        ax.axhline(
            peak_ratio * first,
            color="grey",
            linestyle=":",
            label=f"{peak_ratio:g}x the {next(iter(peaks))} peak",
        )
    ax.set_xlabel("seconds since `trainflow run` started")
    ax.set_ylabel("RSS of the run's process tree (GiB)")
    ax.set_title("Memory over time of whole pipeline runs")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    png = out_dir / f"{name}.png"
    fig.savefig(png, dpi=110)
    data = out_dir / f"{name}.json"
    data.write_text(
        json.dumps(
            {label: [[t, rss] for t, rss, *_ in series] for label, series in runs.items()},
            indent=None,
        )
    )
    return png, data
