"""The sweep stage's MLflow records without a sweep: the search space as
readable JSON, rounded figures, trial runs found by their trial-id tag."""

from __future__ import annotations

import json
from types import SimpleNamespace

from training.config import PipelineConfig
from training.stages import sweep as sweep_stage
from training.tune.outcome import SweepOutcome


def test_search_space_params_are_readable_json_without_none():
    params = sweep_stage.search_space_params(PipelineConfig())
    assert params["search_space.train.lr"] == '{"loguniform": [0.001, 0.02]}'
    for value in params.values():
        assert "None" not in value and "null" not in value
        assert isinstance(json.loads(value), dict)
    assert set(sweep_stage.search_space(PipelineConfig())) == {
        key.removeprefix("search_space.") for key in params
    }


def test_epochs_saved_fraction_is_rounded():
    outcome = SweepOutcome.__new__(SweepOutcome)
    outcome.trials, outcome.metric, outcome.best_metric = [], "val_accuracy", 0.9
    outcome.epochs_spent, outcome.epochs_budget = 11, 20
    counts = sweep_stage._counts(outcome, 1 - 0.55)  # 0.44999999999999996
    assert counts["epochs_saved_fraction"] == 0.45


def _run(tags: dict) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(tags=tags))


def test_trial_runs_are_found_by_their_trial_id_tag():
    by_id = {"898e2_00000": "t0", "898e2_00001": "t1"}
    assert sweep_stage._trial_of(_run({"trainflow.trial_id": "898e2_00001"}), by_id) == "t1"
    # runs logged before the tag: Ray's own trial_name
    assert sweep_stage._trial_of(_run({"trial_name": "_fn_898e2_00000"}), by_id) == "t0"
    assert sweep_stage._trial_of(_run({}), by_id) is None
