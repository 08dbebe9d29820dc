"""Plots (PNG files, matplotlib's Agg backend: no display needed), readable names and fates of
sweep trials, and the self-contained HTML report of a pipeline run.

New plots come in pairs: ``*_figure`` builds and returns the matplotlib figure (the tests count its
series), ``*_png`` saves it and returns the path. ``sweep_plots``/``evaluation_plots`` write every
plot of a stage; ``pipeline_report_html`` embeds them (base64) in one HTML page.

matplotlib is imported inside each function, so importing this module costs nothing.
"""

from __future__ import annotations

import base64
import html
import math
import numbers
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: no display, safe in worker threads and processes
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def confusion_matrix_png(matrix: Any, class_names: Sequence[str], path: str) -> str:
    """An annotated heatmap of ``matrix[true][predicted]`` counts; returns ``path``."""
    import numpy as np

    counts = np.asarray(matrix, dtype=float)
    n = len(class_names)
    if counts.shape != (n, n):
        raise ValueError(f"confusion matrix has shape {counts.shape}, expected ({n}, {n})")
    plt = _pyplot()
    size = max(4.0, 0.5 * n + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ticks = list(range(n))
    names = [str(c) for c in class_names]
    ax.set_xticks(ticks, labels=names, rotation=45 if max(map(len, names), default=0) > 3 else 0)
    ax.set_yticks(ticks, labels=names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion matrix")
    threshold = counts.max() / 2 if counts.size else 0
    for i in range(n):
        for j in range(n):
            value = counts[i, j]
            text = f"{int(value)}" if value == int(value) else f"{value:.2f}"
            color = "white" if value > threshold else "black"
            ax.text(j, i, text, ha="center", va="center", color=color, fontsize=8)
    return _save(fig, path)


def learning_curves_png(
    history: list[dict[str, Any]],
    path: str,
    metrics: Sequence[str] = ("train_loss", "val_loss", "val_accuracy"),
    step_key: str = "epoch",
) -> str:
    """Losses on the left axis, accuracies (names containing "acc") on a right axis, per epoch."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    right = None
    for k, metric in enumerate(metrics):
        points = [
            (row.get(step_key, i), float(row[metric]))
            for i, row in enumerate(history)
            if _is_number(row.get(metric))
        ]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        if "acc" in metric:
            right = right or ax.twinx()
            right.plot(xs, ys, marker="o", linestyle="--", label=metric, color=f"C{k}")
            right.set_ylabel("accuracy")
        else:
            ax.plot(xs, ys, marker="o", label=metric, color=f"C{k}")
    ax.set_xlabel(step_key)
    ax.set_ylabel("loss")
    ax.set_title("learning curves")
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        more_handles, more_labels = right.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        ax.legend(handles, labels, loc="best")
    ax.grid(alpha=0.3)
    return _save(fig, path)


# --------------------------------------------------------------------- sweep trials: names, fates

# Short names of swept keys in run names ("trial 03 · lr=0.0031 bs=64").
PARAM_ABBREVIATIONS = {"batch_size": "bs", "weight_decay": "wd", "hidden_sizes": "hidden"}
FATES = ("completed", "stopped-early", "errored")
MAX_RUN_NAME = 250


def trial_number(trial_id: str) -> int | None:
    """Tune's trial ids end in a counter: ``f3f1c_00003`` -> 3."""
    tail = str(trial_id).rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def short_param(key: str) -> str:
    name = str(key).rsplit(".", 1)[-1]
    return PARAM_ABBREVIATIONS.get(name, name)


def format_value(value: Any) -> str:
    """Two significant digits for floats (0.0031, 1.5e-05), lists as 128x64."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) >= 100 else f"{value:.2g}"
    if isinstance(value, list | tuple):
        return "x".join(format_value(v) for v in value)
    return str(value)


def trial_run_name(trial_id: str, params: Mapping[str, Any], width: int = 2) -> str:
    """``trial 03 · lr=0.0031 bs=64``: the trial's number and its sampled values."""
    number = trial_number(trial_id)
    head = f"trial {number:0{width}d}" if number is not None else f"trial {trial_id}"
    values = " ".join(f"{short_param(k)}={format_value(v)}" for k, v in params.items())
    return (f"{head} · {values}" if values else head)[:MAX_RUN_NAME]


def number_width(num_samples: int) -> int:
    return max(2, len(str(max(int(num_samples) - 1, 0))))


def asha_milestones(max_t: int, grace_period: int, reduction_factor: float) -> list[int]:
    """The iterations at which ASHA compares a trial with its peers (its rungs), ascending.

    Mirrors Ray's ``_Bracket`` (one bracket): ``grace_period * reduction_factor**k`` for
    ``k < int(log(max_t / grace_period) / log(reduction_factor)) + 1``; results are integer
    iterations, so a fractional milestone is reached at the next whole iteration.
    """
    if max_t < 1 or grace_period < 1 or reduction_factor <= 1:
        return []
    rungs = int(math.log(max_t / grace_period) / math.log(reduction_factor) + 1)
    milestones = {
        math.ceil(round(grace_period * reduction_factor**k, 9)) for k in range(max(rungs, 0))
    }
    return sorted(m for m in milestones if m <= max_t)


def rung_of(iteration: int, milestones: Sequence[int]) -> int | None:
    """1-based rung number of an iteration at which ASHA compares trials, else None."""
    return milestones.index(iteration) + 1 if iteration in milestones else None


def fate_detail(
    status: str, epochs: int, max_t: int, milestones: Sequence[int], error: str | None = None
) -> str:
    """How a trial ended, in words: "stopped by ASHA at rung 2 (iteration 2 of 3)"."""
    if status == "completed":
        return f"completed all {epochs} iterations"
    if status == "errored":
        return f"errored at iteration {epochs}: {error or 'unknown error'}"
    if status == "stopped-early":
        rung = rung_of(epochs, milestones)
        if rung is not None:
            return f"stopped by ASHA at rung {rung} (iteration {epochs} of {max_t})"
        return f"stopped early at iteration {epochs} of {max_t}"
    return status


def _asha(asha: Any) -> dict[str, Any]:
    """``sweep.asha`` as a dict, from the pydantic model or its dump."""
    return asha.model_dump() if hasattr(asha, "model_dump") else dict(asha)


def trial_rows(sweep: Mapping[str, Any], asha: Any) -> list[dict[str, Any]]:
    """The sweep's trials (``SweepOutcome.to_dict()``) with ``name``, ``fate``, ``rung`` and
    ``best`` added, in trial order."""
    settings = _asha(asha)
    max_t = int(settings["max_t"])
    milestones = asha_milestones(max_t, settings["grace_period"], settings["reduction_factor"])
    trials = list(sweep.get("trials") or [])
    width = number_width(len(trials))
    rows = []
    for trial in trials:
        epochs = int(trial.get("epochs") or 0)
        status = trial.get("status", "")
        rows.append(
            {
                **trial,
                "name": trial_run_name(trial["trial_id"], trial.get("params") or {}, width),
                "fate": fate_detail(status, epochs, max_t, milestones, trial.get("error")),
                "rung": rung_of(epochs, milestones) if status == "stopped-early" else None,
                "best": trial["trial_id"] == sweep.get("best_trial_id"),
            }
        )
    return rows


def sweep_saving(sweep: Mapping[str, Any]) -> float | None:
    """The share of the full budget (num_samples x max_t epochs) that ASHA did not spend."""
    budget = sweep.get("epochs_budget") or 0
    return 1 - sweep.get("epochs_spent", 0) / budget if budget else None


# ----------------------------------------------------------------------------------- sweep plots

_FATE_LINE = {
    "completed": {"linestyle": "-", "marker": "o"},
    "stopped-early": {"linestyle": "--", "marker": "o"},
    "errored": {"linestyle": ":", "marker": "x"},
}
_FATE_COLOR = {"completed": "C2", "stopped-early": "C1", "errored": "C3"}


def _numbers(history: Sequence[Mapping[str, Any]], metric: str) -> list[tuple[float, float]]:
    return [
        (float(row.get("epoch", i + 1)), float(row[metric]))
        for i, row in enumerate(history)
        if _is_number(row.get(metric))
    ]


def sweep_curves_figure(
    trials: Sequence[Mapping[str, Any]],
    max_t: int,
    milestones: Sequence[int] = (),
    metrics: Sequence[str] = ("val_accuracy", "val_loss"),
):
    """One panel per metric, one line per trial (rows of :func:`trial_rows`). Stopped trials
    are dashed and end in a cross where ASHA cut them; dotted verticals mark the rungs."""
    plt = _pyplot()
    shown = [m for m in metrics if any(_numbers(t.get("history") or [], m) for t in trials)]
    shown = shown or list(metrics[:1])
    fig, axes = plt.subplots(1, len(shown), figsize=(6.5 * len(shown), 4.6), squeeze=False)
    for ax, metric in zip(axes[0], shown, strict=True):
        for k, trial in enumerate(trials):
            points = _numbers(trial.get("history") or [], metric)
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            status = trial.get("status", "")
            color = f"C{k % 10}"
            label = trial.get("name") or str(trial.get("trial_id"))
            if trial.get("rung"):
                label = f"{label} (stopped at rung {trial['rung']})"
            elif status != "completed":
                label = f"{label} ({status})"
            ax.plot(
                xs,
                ys,
                color=color,
                label=label,
                linewidth=2.6 if trial.get("best") else 1.4,
                **_FATE_LINE.get(status, {"linestyle": "-", "marker": "."}),
            )
            if status != "completed":  # where the trial was cut short
                ax.plot(xs[-1], ys[-1], marker="X", markersize=11, color=color, label="_cut")
        for milestone in milestones:
            ax.axvline(milestone, color="grey", linestyle=":", linewidth=0.9, label="_rung")
        ax.set_xlim(0.7, max(max_t, 1) + 0.3)
        if max_t <= 30:
            ax.set_xticks(range(1, max_t + 1))
        ax.set_xlabel("iteration (epoch)")
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(3, len(handles)),
            fontsize=8,
        )
    fig.suptitle(
        "sweep: learning curves of all trials "
        "(dashed + cross: stopped by ASHA; dotted lines: rungs; thick: best)"
    )
    fig.tight_layout()
    return fig


def asha_rungs_figure(
    trials: Sequence[Mapping[str, Any]],
    max_t: int,
    milestones: Sequence[int] = (),
    epochs_spent: int | None = None,
    epochs_budget: int | None = None,
):
    """Bars: how many trials were still alive at each iteration; rung iterations highlighted
    and annotated with how many trials ASHA stopped there."""
    plt = _pyplot()
    iterations = list(range(1, max(max_t, 1) + 1))
    epochs = [int(t.get("epochs") or 0) for t in trials]
    alive = [sum(1 for e in epochs if e >= i) for i in iterations]
    colors = ["C1" if i in milestones else "C0" for i in iterations]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(iterations) + 3), 4))
    bars = ax.bar(iterations, alive, color=colors, edgecolor="black", linewidth=0.5)
    top = max(alive, default=0)
    for bar, count in zip(bars, alive, strict=True):
        ax.annotate(
            str(count),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    for rung, milestone in enumerate(milestones, start=1):
        stopped = sum(
            1
            for t in trials
            if t.get("status") == "stopped-early" and int(t.get("epochs") or 0) == milestone
        )
        ax.annotate(
            f"rung {rung}\n{stopped} stopped",
            (milestone, top * 1.08 + 0.3),
            ha="center",
            va="bottom",
            fontsize=8,
            color="C1",
        )
    ax.set_ylim(0, top * 1.35 + 1)
    if len(iterations) <= 30:
        ax.set_xticks(iterations)
    ax.set_xlabel("iteration (epoch)")
    ax.set_ylabel("trials alive")
    title = "ASHA: trials alive per iteration (orange: rungs)"
    if epochs_budget:
        spent = epochs_spent if epochs_spent is not None else sum(epochs)
        title += f"\n{spent} of {epochs_budget} epochs spent, {1 - spent / epochs_budget:.0%} saved"
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def param_metric_figure(
    trials: Sequence[Mapping[str, Any]], param: str, metric: str = "val_accuracy"
):
    """Each trial's value of ``param`` against its last reported ``metric``: one scatter series
    per fate, the best trial ringed, points labelled with the trial number."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    points = [
        (t, (t.get("params") or {}).get(param), (t.get("metrics") or {}).get(metric))
        for t in trials
    ]
    points = [(t, x, y) for t, x, y in points if x is not None and _is_number(y)]
    numeric = bool(points) and all(_is_number(x) for _, x, _ in points)
    if numeric:
        position = {id(t): float(x) for t, x, _ in points}
        values = [float(x) for _, x, _ in points]
        if min(values) > 0 and max(values) / min(values) >= 20:
            ax.set_xscale("log")
    else:
        categories = sorted({format_value(x) for _, x, _ in points})
        position = {id(t): float(categories.index(format_value(x))) for t, x, _ in points}
        ax.set_xticks(range(len(categories)), labels=categories)
    for fate in FATES:
        members = [(t, y) for t, _, y in points if t.get("status") == fate]
        if not members:
            continue
        ax.scatter(
            [position[id(t)] for t, _ in members],
            [float(y) for _, y in members],
            color=_FATE_COLOR[fate],
            label=fate,
            s=45,
            zorder=3,
        )
    for t, _, y in points:
        number = trial_number(str(t.get("trial_id")))
        ax.annotate(
            f"{number:02d}" if number is not None else str(t.get("trial_id")),
            (position[id(t)], float(y)),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
        if t.get("best"):
            ax.scatter(
                [position[id(t)]],
                [float(y)],
                s=200,
                facecolors="none",
                edgecolors="black",
                linewidths=1.5,
                zorder=4,
                label="best",
            )
    ax.margins(x=0.1, y=0.12)
    ax.set_xlabel(param)
    ax.set_ylabel(f"{metric} (last reported)")
    ax.set_title(f"{param} vs {metric}")
    ax.grid(alpha=0.3)
    if points:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def per_class_figure(per_class: Sequence[Mapping[str, Any]]):
    """Grouped bars: precision and recall of each class."""
    import numpy as np

    plt = _pyplot()
    names = [str(row["class"]) for row in per_class]
    x = np.arange(len(names))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(names) + 2), 4))
    for offset, key in ((-width / 2, "precision"), (width / 2, "recall")):
        ax.bar(x + offset, [float(row[key]) for row in per_class], width, label=key)
    ax.set_xticks(x, labels=names, rotation=45 if max(map(len, names), default=0) > 3 else 0)
    ax.set_ylim(0, 1.25)
    ax.set_xlabel("class")
    ax.set_ylabel("score")
    ax.set_title("per-class precision and recall (test split)")
    ax.legend(loc="upper right", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def per_class_png(per_class: Sequence[Mapping[str, Any]], path: str) -> str:
    return _save(per_class_figure(per_class), path)


def _file_key(param: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", param).strip("_") or "param"


def sweep_plots(sweep: Mapping[str, Any], asha: Any, directory: str) -> dict[str, str]:
    """Every plot of a sweep (``SweepOutcome.to_dict()``), as ``{file name: path}``:
    sweep_curves.png, asha_rungs.png and one param_<key>.png per swept parameter."""
    settings = _asha(asha)
    max_t = int(settings["max_t"])
    milestones = asha_milestones(max_t, settings["grace_period"], settings["reduction_factor"])
    rows = trial_rows(sweep, settings)
    metric = sweep.get("metric") or "val_accuracy"
    others = [m for m in ("val_accuracy", "val_loss") if m != metric]
    plots = {
        "sweep_curves.png": _save(
            sweep_curves_figure(rows, max_t, milestones, metrics=(metric, *others)),
            os.path.join(directory, "sweep_curves.png"),
        ),
        "asha_rungs.png": _save(
            asha_rungs_figure(
                rows, max_t, milestones, sweep.get("epochs_spent"), sweep.get("epochs_budget")
            ),
            os.path.join(directory, "asha_rungs.png"),
        ),
    }
    params: list[str] = []
    for row in rows:
        params += [k for k in row.get("params") or {} if k not in params]
    for param in params:
        name = f"param_{_file_key(param)}.png"
        plots[name] = _save(param_metric_figure(rows, param, metric), os.path.join(directory, name))
    return plots


def evaluation_plots(
    per_class: Sequence[Mapping[str, Any]],
    confusion: Any,
    class_names: Sequence[str],
    directory: str,
) -> dict[str, str]:
    """confusion_matrix.png and per_class.png, as ``{file name: path}``."""
    return {
        "confusion_matrix.png": confusion_matrix_png(
            confusion, class_names, os.path.join(directory, "confusion_matrix.png")
        ),
        "per_class.png": per_class_png(per_class, os.path.join(directory, "per_class.png")),
    }


# ------------------------------------------------------------------------------ the HTML report

REPORT_SECTIONS = ("summary", "data", "sweep", "plots", "test-metrics", "gate", "config", "where")

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:1200px;
color:#1f272d;padding:0 1rem}
h1{font-size:1.6rem}h2{border-bottom:1px solid #d9dde1;padding-bottom:.3rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d9dde1;padding:.25rem .6rem;
text-align:left;font-size:.9rem}th{background:#f3f5f7}tr.best{background:#e8f6ec;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{display:inline-block;margin:.5rem;vertical-align:top}
figure img{max-width:100%;border:1px solid #d9dde1}
figcaption{font-size:.85rem;color:#5f6b76}
pre{background:#f3f5f7;padding:.8rem;overflow-x:auto;font-size:.8rem}
.decision{font-size:1.1rem;font-weight:700}
"""


def _e(value: Any) -> str:
    if isinstance(value, float):
        value = f"{value:.4g}"
    return html.escape(str(value), quote=True)


def _kv_table(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _image_tag(path: str, title: str) -> str:
    with open(path, "rb") as handle:
        data = base64.b64encode(handle.read()).decode("ascii")
    return (
        f'<figure><img alt="{_e(title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(title)}</figcaption></figure>"
    )


def _sweep_section(sweep: Mapping[str, Any] | None, asha: Any) -> str:
    if not sweep:
        return "<p>No sweep (sweep.enabled false): trained with the configured values.</p>"
    rows = trial_rows(sweep, asha)
    metric = sweep.get("metric", "val_accuracy")
    fates = {fate: sum(1 for r in rows if r.get("status") == fate) for fate in FATES}
    saving = sweep_saving(sweep)
    best = next((r for r in rows if r["best"]), None)
    facts = [
        ("best trial", f"{best['name']} ({best['trial_id']})" if best else "none"),
        (f"best {metric}", sweep.get("best_metric")),
        ("trials", ", ".join(f"{n} {fate}" for fate, n in fates.items())),
        (
            "epochs spent / budget",
            f"{sweep.get('epochs_spent')} / {sweep.get('epochs_budget')}"
            + (f" ({saving:.0%} saved by ASHA)" if saving is not None else ""),
        ),
    ]
    params: list[str] = []
    for row in rows:
        params += [k for k in row.get("params") or {} if k not in params]
    sign = 1 if metric != "val_loss" else -1
    ordered = sorted(
        rows,
        key=lambda r: (
            not _is_number((r.get("metrics") or {}).get(metric)),
            -sign * float((r.get("metrics") or {}).get(metric) or 0),
        ),
    )
    head = (
        "<tr><th>trial</th>"
        + "".join(f"<th>{_e(p)}</th>" for p in params)
        + "<th>epochs</th><th>val_accuracy</th><th>val_loss</th><th>fate</th></tr>"
    )
    body = ""
    for row in ordered:
        metrics = row.get("metrics") or {}
        cells = "".join(
            f"<td>{_e(format_value((row.get('params') or {}).get(p)))}</td>" for p in params
        )
        body += (
            f'<tr class="{"best" if row["best"] else ""}"><td>{_e(row["name"])}</td>{cells}'
            f'<td class="num">{_e(row.get("epochs"))}</td>'
            f'<td class="num">{_e(metrics.get("val_accuracy", "-"))}</td>'
            f'<td class="num">{_e(metrics.get("val_loss", "-"))}</td>'
            f"<td>{_e(row['fate'])}</td></tr>"
        )
    return _kv_table(facts) + f'<table class="trials">{head}{body}</table>'


def pipeline_report_html(
    summary: Mapping[str, Any],
    config: Mapping[str, Any],
    plots: Mapping[str, str],
    config_text: str | None = None,
    per_class: Sequence[Mapping[str, Any]] | None = None,
    links: Mapping[str, str] | None = None,
) -> str:
    """One self-contained HTML page of a pipeline run.

    ``summary`` is the flow's summary dict, ``config`` the resolved config (``model_dump(mode=
    "json")``, credentials already redacted), ``plots`` maps a caption to a PNG file (embedded as
    base64), ``config_text`` the config as shown (YAML; defaults to ``config`` as YAML),
    ``links`` optional name -> URL (MLflow pages).
    """
    import yaml

    data = summary.get("data") or {}
    mlflow = summary.get("mlflow") or {}
    model = summary.get("model") or {}
    sweep = summary.get("sweep")
    asha = (config.get("sweep") or {}).get("asha") or {
        "max_t": 1,
        "grace_period": 1,
        "reduction_factor": 2,
    }
    run_id = summary.get("run_id", "?")
    test_metrics = summary.get("test_metrics") or {}
    gate_metric = ((config.get("mlflow") or {}).get("gate") or {}).get("metric", "test_accuracy")
    decision = model.get("decision", "?")

    headline = [
        ("test " + gate_metric.removeprefix("test_"), test_metrics.get(gate_metric, "-")),
        ("gate decision", decision),
        ("model version", f"{model.get('name', '?')} version {model.get('version', '?')}"),
    ]
    if sweep:
        best = next((r for r in trial_rows(sweep, asha) if r["best"]), None)
        headline.insert(0, ("best trial", best["name"] if best else "none"))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>trainflow run {_e(run_id)}</title><style>{_CSS}</style></head><body>",
        f"<h1>trainflow run <code>{_e(run_id)}</code></h1>",
        f"<p>Generated {_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}; "
        f"MLflow experiment <code>{_e(mlflow.get('experiment', '?'))}</code>, parent run "
        f"<code>{_e(mlflow.get('parent_run_id', '?'))}</code>.</p>",
        '<section id="summary"><h2>Summary</h2>',
        _kv_table(headline),
        "</section>",
        '<section id="data"><h2>Data</h2>',
        _kv_table(
            [
                ("source", data.get("source", "?")),
                ("fingerprint", data.get("fingerprint", "?")),
                ("preprocessing", "cached" if data.get("preprocess_cached") else "computed"),
                *((f"rows {split}", rows) for split, rows in (data.get("rows") or {}).items()),
            ]
        ),
        "</section>",
        '<section id="sweep"><h2>Sweep (Ray Tune + ASHA)</h2>',
        _sweep_section(sweep, asha),
        "</section>",
        '<section id="plots"><h2>Plots</h2>',
        *(_image_tag(path, title) for title, path in plots.items()),
        "</section>",
        '<section id="test-metrics"><h2>Test metrics</h2>',
        _kv_table(list(test_metrics.items())),
    ]
    if per_class:
        head = "<tr><th>class</th><th>precision</th><th>recall</th><th>f1</th><th>support</th></tr>"
        body = "".join(
            f"<tr><td>{_e(r.get('class'))}</td>"
            + "".join(
                f'<td class="num">{_e(r.get(k))}</td>'
                for k in ("precision", "recall", "f1", "support")
            )
            + "</tr>"
            for r in per_class
        )
        parts.append(f'<table class="per-class">{head}{body}</table>')
    parts += [
        "</section>",
        '<section id="gate"><h2>Registry and gate</h2>',
        f'<p class="decision">gate decision: {_e(decision)}</p>',
        _kv_table(
            [
                ("registered model", model.get("name", "?")),
                ("this version", model.get("version", "?")),
                ("gate metric", gate_metric),
                ("this version's value", model.get("challenger_value", "-")),
                ("champion's value before", model.get("champion_value") or "none"),
                ("champion now", f"version {model.get('champion_version', '?')}"),
                ("aliases of this version", ", ".join(model.get("aliases") or []) or "none"),
            ]
        ),
        "</section>",
        '<section id="config"><h2>Configuration</h2>',
        f"<pre>{_e(config_text or yaml.safe_dump(dict(config), sort_keys=False))}</pre>",
        "</section>",
        '<section id="where"><h2>Where things are</h2>',
        _kv_table(
            [
                ("tracking URI", mlflow.get("tracking_uri", "?")),
                ("open the MLflow UI", mlflow.get("ui_command", "?")),
                ("checkpoint", summary.get("checkpoint", "?")),
                ("run storage", summary.get("storage", "?")),
                *((f"seconds: {k}", v) for k, v in (summary.get("stage_seconds") or {}).items()),
            ]
        ),
    ]
    if links:
        parts.append(
            "<ul>"
            + "".join(f'<li><a href="{_e(url)}">{_e(name)}</a></li>' for name, url in links.items())
            + "</ul>"
        )
    parts += ["</section>", "</body></html>"]
    return "\n".join(parts)


def report_markdown(summary: Mapping[str, Any], report_location: str) -> str:
    """The Prefect artifact that points at the HTML report."""
    model = summary.get("model") or {}
    sweep = summary.get("sweep")
    lines = [f"# trainflow report `{summary.get('run_id', '?')}`", ""]
    if sweep:
        saving = sweep_saving(sweep)
        lines.append(
            f"- sweep: best trial `{sweep.get('best_trial_id')}`, {sweep.get('metric')} = "
            f"{_e(sweep.get('best_metric'))}; {sweep.get('epochs_spent')} of "
            f"{sweep.get('epochs_budget')} epochs"
            + (f" ({saving:.0%} saved by ASHA)" if saving is not None else "")
        )
    lines += [
        "- test: "
        + ", ".join(f"{k} = {_e(v)}" for k, v in (summary.get("test_metrics") or {}).items()),
        f"- model `{model.get('name', '?')}` version {model.get('version', '?')}: "
        f"gate **{model.get('decision', '?')}**",
        "",
        f"Full report (config, data, sweep table, plots, metrics, gate): {report_location}",
    ]
    return "\n".join(lines)


def pipeline_plots(
    directory: str,
    sweep: Mapping[str, Any] | None = None,
    asha: Any = None,
    train_history: Sequence[Mapping[str, Any]] | None = None,
    per_class: Sequence[Mapping[str, Any]] | None = None,
    confusion: Any = None,
    class_names: Sequence[str] | None = None,
) -> dict[str, str]:
    """Every plot of a pipeline run for the HTML report, as ``{caption: path}`` in stage order."""
    plots: dict[str, str] = {}
    if sweep and asha is not None:
        metric = sweep.get("metric") or "val_accuracy"
        for name, path in sweep_plots(sweep, asha, directory).items():
            if name == "sweep_curves.png":
                caption = "sweep: learning curves of all trials"
            elif name == "asha_rungs.png":
                caption = "sweep: trials alive per iteration (ASHA rungs)"
            else:
                caption = f"sweep: {name.removeprefix('param_').removesuffix('.png')} vs {metric}"
            plots[caption] = path
    if train_history is not None:
        plots["final training: train/val curves"] = learning_curves_png(
            list(train_history), os.path.join(directory, "curves.png")
        )
    if per_class is not None and confusion is not None and class_names is not None:
        files = evaluation_plots(per_class, confusion, class_names, directory)
        plots["evaluation: confusion matrix (test split)"] = files["confusion_matrix.png"]
        plots["evaluation: per-class precision and recall"] = files["per_class.png"]
    return plots
