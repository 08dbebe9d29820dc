"""Validation metrics over every rank's share of the validation split (all-reduced, so rank 0's
report, which Tune sees, holds the global ones): a classifier's val_loss and val_accuracy, a
regression's val_loss (normalised MSE) and val_rmse, val_mae, val_r2 in the label's own unit,
a language model's val_loss (per next-token target) and val_perplexity."""

from __future__ import annotations

import math
from typing import Any

import torch

from training.metrics import regression_metrics
from training.model.trainflow_pyfunc.causal_lm import target_count


@torch.no_grad()
def validate(run: Any) -> dict[str, float]:
    """The run's validation metrics (``run``: the loop's ``_Run``)."""
    run.model.eval()
    if run.spec.task == "causal_lm":
        return _validate_lm(run)
    regression = run.spec.is_regression
    # Sums, all-reduced: loss, rows, then correct (classes) or sum e², sum |e|, sum y, sum y².
    totals = torch.zeros(6 if regression else 3, dtype=torch.float64)
    for features, labels in run.ctx.val_batches(run.batch_rows):
        output = run.model(features)
        sums = [run.loss_fn(output, labels).item(), len(labels)]
        if regression:
            y = labels.double()
            error = output.squeeze(1).double() - y
            sums += [error.square().sum(), error.abs().sum(), y.sum(), y.square().sum()]
        else:
            sums.append((output.argmax(dim=1) == labels).sum())
        totals += torch.tensor([float(v) for v in sums], dtype=torch.float64)
    totals = run.ctx.all_reduce_sum(totals).tolist()
    rows = max(totals[1], 1.0)
    if not regression:
        return {"val_loss": totals[0] / rows, "val_accuracy": totals[2] / rows}
    # The sums are in the normalised unit: RMSE and MAE scale back by the label's std.
    metrics = regression_metrics([totals[1], *totals[2:]], scale=run.spec.label_std)
    return {"val_loss": totals[0] / rows, **metrics}


def _validate_lm(run: Any) -> dict[str, float]:
    """Mean next-token cross-entropy over every validation target, and its exponential."""
    totals = torch.zeros(2, dtype=torch.float64)  # loss sum, targets
    for features, _ in run.ctx.val_batches(run.batch_rows):
        loss = run.loss_fn(run.model(features), features).item()
        totals += torch.tensor([loss, target_count(features)], dtype=torch.float64)
    loss_sum, targets = run.ctx.all_reduce_sum(totals).tolist()
    val_loss = loss_sum / max(targets, 1.0)
    return {"val_loss": val_loss, "val_perplexity": perplexity(val_loss)}


def perplexity(loss: float) -> float:
    """exp(mean next-token loss); inf past float range (a diverged model, named as such)."""
    return math.exp(loss) if loss < 700 else math.inf
