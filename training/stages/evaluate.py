"""Stage 4: the best checkpoint, as the pyfunc model it becomes, scores the test split's raw rows;
trainflow's report and MLflow's own evaluation of the same predictions go to the evaluate run.

The checkpoint is loaded once and the example rows read once, here: promote takes both from
:class:`Evaluated`.
"""

from __future__ import annotations

import tempfile

import pandas as pd

from training import progress
from training.config import PipelineConfig
from training.data.splits import raw_rows, raw_split_here
from training.inference.evaluate import SCORE_HERE_BELOW_ROWS, EvalResult, evaluate_model
from training.manifest import FeatureSpec, Manifest
from training.report.plots import evaluation_plots, regression_plots
from training.stages.connect import connect_ray
from training.stages.evaluated import Evaluated, open_evaluation
from training.tracking import evaluation, flavour
from training.tracking.runs import Tracker

#: The gate scores the champion on the test split's rows in the driver below this many rows
#: (the split scored in the driver, in the order the gate reads it again).
GATE_ROWS_LIMIT = SCORE_HERE_BELOW_ROWS


def _test_rows(manifest: Manifest, endpoint: str | None) -> pd.DataFrame | None:
    """The test split's raw rows, in the order the driver scored them; None when large."""
    if manifest.rows.get("test", GATE_ROWS_LIMIT) >= GATE_ROWS_LIMIT:
        return None
    batches = list(raw_split_here(manifest, "test", endpoint))
    return pd.concat(batches, ignore_index=True) if batches else None


def evaluate(
    config: PipelineConfig, manifest: Manifest, checkpoint_path: str, parent_run: str
) -> Evaluated:
    """Score the test split's raw rows through the pyfunc model the checkpoint becomes; log
    trainflow's report and MLflow's own evaluation (classifier or regressor) of the same
    predictions."""
    if manifest.spec.task == "causal_lm":  # perplexity and generated samples
        from training.stages.evaluate_lm import evaluate_lm

        return evaluate_lm(config, manifest, checkpoint_path, parent_run)
    connect_ray(config)
    tracker, eval_run, state = open_evaluation(config, manifest, checkpoint_path, parent_run)
    endpoint = config.storage.endpoint_url
    example = raw_rows(manifest, "test", flavour.EXAMPLE_ROWS, endpoint)
    with tempfile.TemporaryDirectory() as tmp:
        files = flavour.pack(flavour.save_model(state, f"{tmp}/model", example))
    classes = FeatureSpec.from_dict(state["spec"]).classes
    result, scored = evaluate_model(
        files, classes, manifest, "test", endpoint, use_gpu=config.train.use_gpu
    )
    tracker.log_metrics(eval_run, result.metrics)
    _log_report(tracker, eval_run, result)
    evaluation.evaluate_predictions(
        tracker, eval_run, scored.labels, scored.predictions, scored.probs, scored.classes
    )
    tracker.log_metrics(parent_run, result.metrics)
    tracker.end_run(eval_run)
    progress.report("evaluate", result.headline, metrics=result.metrics)
    rows = _test_rows(manifest, endpoint)
    same = rows is not None and len(rows) == len(scored.labels)
    return Evaluated(
        result,
        state,
        example,
        rows if same else None,
        scored.labels if same else None,
        scored.predictions if same else None,
        run_id=eval_run,
    )


def _log_report(tracker: Tracker, eval_run: str, result: EvalResult) -> None:
    """Per-class scores and the confusion matrix (a classifier) and the plots."""
    with tempfile.TemporaryDirectory() as tmp:
        if result.task == "regression":
            plots = regression_plots(result.actual, result.predicted, tmp)
        else:
            tracker.log_dict(eval_run, result.per_class, "per_class.json")
            confusion = {"classes": result.class_names, "matrix": result.confusion}
            tracker.log_dict(eval_run, confusion, "confusion.json")
            plots = evaluation_plots(result.per_class, result.confusion, result.class_names, tmp)
        for png in plots.values():
            tracker.log_artifact(eval_run, png, "plots")
