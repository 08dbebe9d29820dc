"""B3: ASHA efficiency, our sweep vs full random search over the same seeded configurations.

Both arms call ``training.tune.sweep.run_sweep`` (Tune function trials, the default) on the default
data and model with ``sweep.num_samples = N`` and ``sweep.seed = 0``, so Tune's seeded
BasicVariantGenerator draws the same N configurations for both (checked). ASHA arm: grace 1,
reduction factor 3, max_t epochs (N = 27, max_t = 27: four rungs, theory 81/729 = 0.11 of the
epochs). Random-search arm: the same sweep with ``grace_period = max_t``, which leaves ASHA a
single rung at max_t, so every trial runs to max_t (ASHA off).

Figures: epochs spent (ASHA ÷ full) and the best validation accuracy lost (full - ASHA, in
points). Full search is deterministic (seeded trials, one thread each), so it runs once; ASHA's
decisions depend on the order results arrive, so it runs ``reps`` times, alternated with it.

Both searchers at equal budget: a third arm runs the same ASHA sweep (N trials, max_t, grace 1)
with ``sweep.searcher = optuna`` (TPE seeded with 0; its configurations differ from random's by
design), and reports its epochs and best accuracy against the same full search, plus its best
accuracy minus random+ASHA's (points, per alternated repetition).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from benchmarks import harness as h
from benchmarks.common import Context, fresh_preprocess, make_config, start_ray

ID = "B3"
TITLE = "ASHA efficiency: our sweep vs full random search on the same seeded configurations"
TIMEOUT_S = (900, 240)
_ANCHOR = "full random search (ASHA off) over the same seeded configurations, each to max_t"
_RANDOM_ANCHOR = "random search + ASHA at the same budget (N trials, max_t, grace 1)"
FIGURES = [
    h.FigureSpec(
        ID, "epochs_ratio", "epochs spent, ASHA ÷ full search", "<= 0.25 (theory 0.11)", _ANCHOR
    ),
    h.FigureSpec(
        ID, "accuracy_gap_points", "best val accuracy lost by ASHA (points)", "<= 1 point", _ANCHOR
    ),
    h.FigureSpec(ID, "wall_ratio", "sweep wall time, ASHA ÷ full search", "—", _ANCHOR),
    h.FigureSpec(
        ID, "optuna_epochs_ratio", "epochs spent, optuna+ASHA ÷ full search", "—", _ANCHOR
    ),
    h.FigureSpec(
        ID,
        "optuna_accuracy_gap_points",
        "best val accuracy lost by optuna+ASHA (points)",
        "—",
        _ANCHOR,
    ),
    h.FigureSpec(
        ID,
        "optuna_vs_random_points",
        "best val accuracy, optuna+ASHA - random+ASHA (points)",
        "—",
        _RANDOM_ANCHOR,
    ),
]


def _sweep_arm(
    base_overrides: dict[str, Any], manifest, layout, grace: int | None, searcher: str = "random"
):
    from training.tune.sweep import run_sweep

    def run(rep: int) -> dict[str, Any]:
        overrides = {**base_overrides, "sweep.searcher": searcher}
        if grace is not None:
            overrides["sweep.asha.grace_period"] = grace
        config = make_config(overrides)
        arm = "full" if grace else ("asha" if searcher == "random" else searcher)
        run_id = f"b3-{arm}-{rep}-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        outcome = run_sweep(config, manifest, run_id, layout)
        seconds = time.perf_counter() - started
        statuses = [t.status for t in outcome.trials]
        return {
            "seconds": seconds,
            "epochs_spent": outcome.epochs_spent,
            "epochs_budget": outcome.epochs_budget,
            "best_val_accuracy": outcome.best_metric,
            "best_params": outcome.best_params,
            "trials": len(outcome.trials),
            "completed": statuses.count("completed"),
            "stopped_early": statuses.count("stopped-early"),
            "errored": statuses.count("errored"),
            "epochs_per_trial": sorted(t.epochs for t in outcome.trials),
            "configs": sorted(
                tuple(sorted((k, round(float(v), 12)) for k, v in t.params.items()))
                for t in outcome.trials
            ),
        }

    return run


def run(ctx: Context) -> h.Outcome:
    n = ctx.pick(27, 4)
    max_t = ctx.pick(27, 2)
    reps = ctx.reps(3, 1)
    ray = start_ray(4)
    base = {
        "sweep.num_samples": n,
        "sweep.max_concurrent_trials": 2,
        "sweep.seed": 0,
        "sweep.asha.max_t": max_t,
        "sweep.asha.grace_period": 1,
        "sweep.asha.reduction_factor": 3,
    }
    config = make_config(base)
    manifest, _, layout = fresh_preprocess(config, ctx.scratch("storage"))
    arms = {
        "asha": _sweep_arm(base, manifest, layout, grace=None),
        "full": _sweep_arm(base, manifest, layout, grace=max_t),
        "optuna": _sweep_arm(base, manifest, layout, grace=None, searcher="optuna"),
    }
    samples = h.run_alternating(arms, {"asha": reps, "full": 1, "optuna": reps}, label=ID)
    full = samples["full"][0]
    same_configs = all(s["configs"] == full["configs"] for s in samples["asha"])
    if not same_configs:
        raise RuntimeError("the two arms sampled different configurations; the seed did not hold")
    asha = samples["asha"]
    epochs_ratio = [s["epochs_spent"] / full["epochs_spent"] for s in asha]
    gap = [100 * (full["best_val_accuracy"] - s["best_val_accuracy"]) for s in asha]
    wall = [s["seconds"] / full["seconds"] for s in asha]
    optuna = samples["optuna"]
    optuna_epochs = [s["epochs_spent"] / full["epochs_spent"] for s in optuna]
    optuna_gap = [100 * (full["best_val_accuracy"] - s["best_val_accuracy"]) for s in optuna]
    # Pairs of alternated repetitions (rep i of each arm ran next to each other).
    optuna_vs_random = [
        100 * (o["best_val_accuracy"] - a["best_val_accuracy"])
        for o, a in zip(optuna, asha, strict=True)
    ]
    for arm in samples.values():  # the config lists served the check; keep the JSON short
        for sample in arm:
            sample.pop("configs")
    return h.Outcome(
        figures=[
            h.Figure(
                "epochs_ratio",
                "epochs spent, ASHA ÷ full search",
                "x",
                epochs_ratio,
                anchor=_ANCHOR,
                target=h.Target("<=", 0.25, "<= 0.25 (theory 0.11)"),
            ),
            h.Figure(
                "accuracy_gap_points",
                "best val accuracy lost by ASHA (points)",
                "points",
                gap,
                anchor=_ANCHOR,
                target=h.Target("<=", 1.0, "<= 1 point"),
            ),
            h.Figure(
                "wall_ratio", "sweep wall time, ASHA ÷ full search", "x", wall, anchor=_ANCHOR
            ),
            h.Figure(
                "optuna_epochs_ratio",
                "epochs spent, optuna+ASHA ÷ full search",
                "x",
                optuna_epochs,
                anchor=_ANCHOR,
            ),
            h.Figure(
                "optuna_accuracy_gap_points",
                "best val accuracy lost by optuna+ASHA (points)",
                "points",
                optuna_gap,
                anchor=_ANCHOR,
            ),
            h.Figure(
                "optuna_vs_random_points",
                "best val accuracy, optuna+ASHA - random+ASHA (points)",
                "points",
                optuna_vs_random,
                anchor=_RANDOM_ANCHOR,
            ),
        ],
        samples=samples,
        params={
            "num_samples": n,
            "max_t": max_t,
            "grace_period": 1,
            "reduction_factor": 3,
            "max_concurrent_trials": 2,
            "seed": 0,
            "search_space": config.sweep.model_dump(mode="json")["search_space"],
            "data": "builtin:digits (default), model mlp (default)",
            "reps": {"asha": reps, "full": 1, "optuna": reps},
            "searchers": {"asha": "random", "full": "random", "optuna": "optuna (TPE, seed 0)"},
            "same_configs": same_configs,
            "ray_num_cpus": 4,
            "ray_start_s": ray.get("_start_s"),
        },
        notes=[
            "full search is deterministic (seeded trials, 1 thread each): run once; ASHA's "
            "stopping depends on result order: run reps times, alternated with it",
            "optuna arm: the same ASHA sweep with sweep.searcher=optuna (TPE, seed 0); its "
            "configurations are its own, so only the random arms are checked to be the same",
        ],
    )
