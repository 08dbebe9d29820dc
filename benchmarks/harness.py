"""What a benchmark module uses to run and report: alternation, statistics, targets, figures.

Nothing here knows about trainflow: the benchmark modules (``b1_...`` to ``b11_...``) do the work
and hand back an ``Outcome``; this module orders the repetitions (A B A B ...), summarises samples
(median of >= 3, spread) and checks targets. Elsewhere: the result files in
``benchmarks.result_files``, the generated docs tables in ``benchmarks.doc_tables``, memory
sampling in ``benchmarks.memory_sampling``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda value, bound: value >= bound,
    "<=": lambda value, bound: value <= bound,
    ">": lambda value, bound: value > bound,
    "<": lambda value, bound: value < bound,
}


def log(message: str) -> None:
    """Progress lines on stderr with a wall-clock stamp (stdout stays clean for summaries)."""
    import sys

    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Alternation


def alternate(arms: Sequence[str], reps: int | Mapping[str, int]) -> list[tuple[int, str]]:
    """Run order ``[(rep, arm), ...]``: A B A B ... so that slow drift hits every arm alike.

    ``reps`` may differ per arm (a deterministic arm can run once): an arm drops out of the
    rotation when its repetitions are done.
    """
    if isinstance(reps, int):
        reps = dict.fromkeys(arms, reps)
    if any(reps.get(arm, 0) < 1 for arm in arms):
        raise ValueError("every arm needs at least one repetition")
    order = []
    for rep in range(max(reps[arm] for arm in arms)):
        order.extend((rep, arm) for arm in arms if rep < reps[arm])
    return order


def run_alternating(
    arms: Mapping[str, Callable[[int], Any]],
    reps: int | Mapping[str, int],
    *,
    label: str = "",
) -> dict[str, list[Any]]:
    """Call each arm's function ``fn(rep)`` in alternation; collect what they return per arm."""
    samples: dict[str, list[Any]] = {arm: [] for arm in arms}
    order = alternate(list(arms), reps)
    for index, (rep, arm) in enumerate(order, start=1):
        log(f"{label} {arm} rep {rep + 1} ({index}/{len(order)})")
        started = time.perf_counter()
        samples[arm].append(arms[arm](rep))
        log(f"{label} {arm} rep {rep + 1} done in {time.perf_counter() - started:.1f} s")
    return samples


# ---------------------------------------------------------------------------------------------
# Statistics


def stats(values: Iterable[float]) -> dict[str, Any]:
    """n, median, min, max, spread (max - min) and relative spread (spread / |median|)."""
    data = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not data:
        return {
            "n": 0,
            "median": None,
            "min": None,
            "max": None,
            "spread": None,
            "rel_spread": None,
            "samples": [],
        }
    median = statistics.median(data)
    spread = max(data) - min(data)
    return {
        "n": len(data),
        "median": median,
        "min": min(data),
        "max": max(data),
        "spread": spread,
        "rel_spread": spread / abs(median) if median else None,
        "samples": data,
    }


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repetition ratios a_i / b_i of two alternated arms (pairs share the machine state)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"unpaired samples: {len(numerators)} vs {len(denominators)}")
    return [a / b for a, b in zip(numerators, denominators, strict=True) if b]


def pluck(samples: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [s[key] for s in samples if s.get(key) is not None]


# ---------------------------------------------------------------------------------------------
# Targets and figures


@dataclass(frozen=True)
class Target:
    """``value <op> bound``, e.g. Target(">=", 0.8, ">= 0.8 at 10x")."""

    op: str
    value: float
    text: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown target operator {self.op!r}; use one of {sorted(_OPS)}")

    def check(self, measured: float | None) -> bool | None:
        if measured is None or not math.isfinite(measured):
            return None
        return _OPS[self.op](measured, self.value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "value": self.value,
            "text": self.text or f"{self.op} {self.value:g}",
        }


@dataclass
class Figure:
    """One reported number: its name, unit, anchor, optional target, and the samples behind it."""

    key: str
    name: str
    unit: str
    samples: list[float]
    anchor: str = ""
    target: Target | None = None
    note: str = ""
    value: float | None = None  # default: the median of the samples

    def to_dict(self) -> dict[str, Any]:
        summary = stats(self.samples)
        value = self.value if self.value is not None else summary["median"]
        return {
            "key": self.key,
            "name": self.name,
            "value": value,
            "unit": self.unit,
            "anchor": self.anchor,
            "target": self.target.to_dict() if self.target else None,
            "pass": self.target.check(value) if self.target else None,
            "note": self.note,
            "stats": summary,
        }


@dataclass
class Outcome:
    """What a benchmark's ``run`` returns: figures plus raw samples, parameters and notes."""

    figures: list[Figure]
    samples: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # parts that failed; the rest still counts


@dataclass(frozen=True)
class FigureSpec:
    """A figure a benchmark promises (its module's ``FIGURES``): a row of the docs table before
    anything is measured."""

    bench_id: str
    key: str
    name: str
    target: str
    anchor: str
