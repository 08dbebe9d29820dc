"""Which way a metric improves: the one rule every ranking, gate and checkpoint score uses."""

from __future__ import annotations

from typing import Any, Literal

Mode = Literal["max", "min"]
#: The validation metrics a sweep may rank by, and the test metrics a gate may compare.
ValMetric = Literal["val_accuracy", "val_loss", "val_rmse", "val_mae", "val_r2", "val_perplexity"]
TestMetric = Literal[
    "test_accuracy",
    "test_macro_f1",
    "test_loss",
    "test_rmse",
    "test_mae",
    "test_r2",
    "test_perplexity",
]

# Errors and losses go down as a model gets better; every other metric (accuracy, F1, R²) goes up.
_LOWER_IS_BETTER = ("loss", "rmse", "mse", "mae", "perplexity")


def direction(metric: str) -> Mode:
    """``"min"`` for losses and errors (``val_loss``, ``test_rmse``), ``"max"`` otherwise."""
    name = metric.rsplit(".", 1)[-1].lower()
    return "min" if name.endswith(_LOWER_IS_BETTER) else "max"


# Metrics that count (test_rows, a language model's test_tokens, a class's support): MLflow keeps
# every metric as a float; tables show these as whole numbers (44,944, not 4.494e+04).
_COUNTS = frozenset({"rows", "samples", "epochs", "steps", "tokens", "support"})


def is_count(metric: str) -> bool:
    """Whether ``metric`` counts something (``test_rows``, ``rows train``): a whole number."""
    name = metric.rsplit(".", 1)[-1].lower()
    return not _COUNTS.isdisjoint(name.replace(" ", "_").split("_"))


def gain(new: float, old: float, mode: Mode) -> float:
    """How much better ``new`` is than ``old`` (negative: worse), whichever way ``mode`` runs."""
    return new - old if mode == "max" else old - new


def worst(mode: Mode) -> float:
    """A value every real score beats."""
    return float("-inf") if mode == "max" else float("inf")


#: The metrics each task reports (validation ``val_*``, test ``test_*``).
TASK_METRICS = {
    "classification": {"val_accuracy", "val_loss", "test_accuracy", "test_macro_f1", "test_loss"},
    "regression": {"val_loss", "val_rmse", "val_mae", "val_r2"}
    | {"test_loss", "test_rmse", "test_mae", "test_r2"},
    "causal_lm": {"val_loss", "val_perplexity", "test_loss", "test_perplexity"},
}
#: Every per-epoch metric the loop may report (either task), in display order.
EPOCH_METRICS = (
    "train_loss",
    "val_loss",
    "val_accuracy",
    "val_rmse",
    "val_mae",
    "val_r2",
    "val_perplexity",
)
# A classification metric a regression does not have -> the regression's own default.
_REGRESSION_DEFAULT = {"accuracy": "rmse", "macro_f1": "rmse"}
# A classifier's default metric -> a language model's: validation ranks by the loss (the
# log of the perplexity), the gate compares test perplexity.
_CAUSAL_LM_DEFAULT = {"val_accuracy": "val_loss", "test_accuracy": "test_perplexity"}
_CAUSAL_LM_DEFAULT["test_macro_f1"] = "test_perplexity"


def for_task(metric: str, task: str) -> str | None:
    """``metric`` as ``task`` knows it: a regression ranks by RMSE where the config names
    accuracy or macro-F1 (the defaults, which are a classifier's); None if the task has no
    such metric (RMSE of a classifier). Unknown names are left alone."""
    if task == "regression":
        split, _, name = metric.partition("_")
        metric = f"{split}_{_REGRESSION_DEFAULT.get(name, name)}"
    if task == "causal_lm":
        metric = _CAUSAL_LM_DEFAULT.get(metric, metric)
    known = set().union(*TASK_METRICS.values())
    if metric in known and metric not in TASK_METRICS.get(task, known):
        return None
    return metric


def follow_task(config: Any, task: str) -> None:
    """Set a ``PipelineConfig``'s ranked, checkpoint and gate metrics to those ``task`` has
    (:func:`for_task`): a regression has no accuracy or F1, so those (the defaults) become its
    RMSE, with mode/order min; a ``ValueError`` names a metric the task does not have (a
    classifier's RMSE). ``PipelineConfig`` calls it when ``data.task`` is set, and the flow sets
    it to the task preprocessing chose."""
    sweep, checkpoint, gate = config.sweep, config.train.checkpoint, config.mlflow.gate
    wanted = {
        "sweep.metric": sweep.metric,
        "train.checkpoint.score_attribute": checkpoint.score_attribute,
        "mlflow.gate.metric": gate.metric,
    }
    for key, metric in wanted.items():
        wanted[key] = for_task(metric, task)
        if wanted[key] is None:
            same_split = metric.split("_", 1)[0]
            allowed = sorted(m for m in TASK_METRICS[task] if m.startswith(same_split))
            raise ValueError(
                f"{key}={metric} is not a metric of {task}; use one of {allowed} (the task "
                "is data.task, or the one detected from the label when data.task=auto)"
            )
    metric = wanted["sweep.metric"]
    if metric != sweep.metric:  # both at once: the section checks that its mode fits the metric
        config.sweep = sweep.model_copy(update={"metric": metric, "mode": direction(metric)})
    score = wanted["train.checkpoint.score_attribute"]
    if score != checkpoint.score_attribute:
        checkpoint.score_attribute, checkpoint.score_order = score, direction(score)
    gate.metric = wanted["mlflow.gate.metric"]


def regression_metrics(sums: list[float], scale: float = 1.0, prefix: str = "val_") -> dict:
    """RMSE, MAE and R² from sums over rows ``[n, sum e², sum |e|, sum y, sum y²]`` (errors
    ``e`` and targets ``y`` in one unit; sums all-reduce across workers). ``scale`` takes RMSE
    and MAE to the label's own unit (R² has none)."""
    n, sse, sae, sum_y, sum_y2 = (float(v) for v in sums)
    n_ = max(n, 1.0)
    sst = sum_y2 - sum_y * sum_y / n_
    return {
        f"{prefix}rmse": scale * (sse / n_) ** 0.5,
        f"{prefix}mae": scale * sae / n_,
        f"{prefix}r2": 1.0 - sse / sst if sst > 0 else 0.0,
    }
