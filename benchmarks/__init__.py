"""trainflow benchmarks B1-B12:
our speed against the limit, side by side.

``python -m benchmarks`` (or ``make bench``) runs them all; ``--only B1,B3`` selects, ``--smoke``
shrinks every size. Each benchmark writes ``benchmarks/results/<ID>.json`` and the summary table
of ``docs/benchmark-figures.md`` is regenerated from those files. See docs/benchmarks.md.

Importing this package is cheap: the benchmark modules import Ray, torch and the pipeline only
inside their ``run`` functions.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# id -> module (in run order: B4 runs the flows that B7's flow-recovery arm can share).
BENCHMARKS: dict[str, str] = {
    "B1": "benchmarks.b1_training_throughput",
    "B2": "benchmarks.b2_preprocessing",
    "B3": "benchmarks.b3_asha",
    "B4": "benchmarks.b4_orchestration",
    "B5": "benchmarks.b5_memory",
    "B6": "benchmarks.b6_sweep_bookkeeping",
    "B7": "benchmarks.b7_recovery",
    "B8": "benchmarks.b8_ingest",
    "B9": "benchmarks.b9_vs_gbdt",
    "B10": "benchmarks.b10_hf_throughput",
    "B11": "benchmarks.b11_lm_throughput",
    "B12": "benchmarks.b12_user_code",
}


def load(bench_id: str) -> ModuleType:
    """The module of one benchmark (``ID``, ``TITLE``, ``FIGURES``, ``TIMEOUT_S``, ``run``)."""
    try:
        return importlib.import_module(BENCHMARKS[bench_id.upper()])
    except KeyError:
        raise ValueError(
            f"unknown benchmark {bench_id!r}; choose from {', '.join(BENCHMARKS)}"
        ) from None


def figure_specs() -> list:
    """Every benchmark's table rows, in order (for docs/benchmark-figures.md)."""
    specs = []
    for bench_id in BENCHMARKS:
        specs.extend(load(bench_id).FIGURES)
    return specs
