"""`trainflow compare`: sorting and formatting on synthetic dicts, then the command against a real
sqlite MLflow store holding a hand-made sweep (no Ray)."""

from __future__ import annotations

import re
import urllib.parse

import pytest
from typer.testing import CliRunner

from trainflow.cli import app
from trainflow.compare import fmt, param_keys, sort_trials, trials_table

EXPERIMENT = "trainflow-compare-unit"


def trial(name, best_value, params=None, **extra):
    return {"name": name, "run_id": f"id-{name}", "best_value": best_value, "params": params or {}}


def test_sort_best_first_for_max_and_min():
    trials = [trial("a", 0.5), trial("b", None), trial("c", 0.9), trial("d", "0.7")]
    assert [t["name"] for t in sort_trials(trials, "max")] == ["c", "d", "a", "b"]
    assert [t["name"] for t in sort_trials(trials, "min")] == ["a", "d", "c", "b"]
    nan = [trial("x", float("nan")), trial("y", 0.1)]
    assert [t["name"] for t in sort_trials(nan, "max")] == ["y", "x"]  # no value: last


def test_fmt_numbers_and_strings():
    assert fmt("0.0037829563842536234") == "0.003783"
    assert fmt(0.93406593) == "0.9341"
    assert fmt("64") == "64"
    assert fmt("[128, 64]") == "[128, 64]"
    assert fmt(None) == "-" and fmt("") == "-"
    assert fmt("nan") == "nan"


def test_table_rows_in_given_order_with_union_of_params():
    from rich.console import Console

    trials = sort_trials(
        [
            {**trial("trial 01 · lr=0.01", 0.7, {"train.lr": "0.01"}), "epochs": 1},
            {
                **trial("trial 00 · lr=0.003", 0.93, {"train.lr": "0.003", "bs": "64"}),
                "epochs": 3,
                "best": True,
                "fate_detail": "completed all 3 iterations",
            },
        ]
    )
    assert param_keys(trials) == ["bs", "train.lr"]
    sweep = {"metric": "val_accuracy", "max_t": "3", "sweep_run_id": "s1", "experiment": "e"}
    console = Console(width=200, record=True)
    console.print(trials_table(sweep, trials))
    text = console.export_text()
    first, second = text.index("trial 00"), text.index("trial 01")
    assert first < second
    assert "best val_accuracy" in text and "3/3" in text and "(best)" in text
    assert "completed all 3 iterations" in text


# ------------------------------------------------------------------- against a real MLflow store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A pipeline run with a sweep of three trials (one stopped by ASHA) in a sqlite store."""
    from training.config import MlflowConfig, PipelineConfig
    from training.tracking.store import configure

    home = tmp_path_factory.mktemp("compare-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFLOW_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        tracker = configure(PipelineConfig(mlflow=MlflowConfig(experiment=EXPERIMENT)))
        parent = tracker.start_parent_run("cmp-1")
        sweep = tracker.start_child_run(parent, "sweep", "sweep")
        tracker.log_params(sweep, {"metric": "val_accuracy", "asha.max_t": 3})
        trials = {}
        for name, lr, curve, fate in (
            ("trial 00 · lr=0.003", 0.003, [0.80, 0.90, 0.88], "completed all 3 iterations"),
            (
                "trial 01 · lr=0.0001",
                0.0001,
                [0.20],
                "stopped by ASHA at rung 1 (iteration 1 of 3)",
            ),
            ("trial 02 · lr=0.01", 0.01, [0.85, 0.95, 0.93], "completed all 3 iterations"),
        ):
            run = tracker.start_child_run(sweep, name, "trial")
            tracker.log_params(run, {"train.lr": lr})
            tracker.log_history(
                run, [{"epoch": e + 1, "val_accuracy": v} for e, v in enumerate(curve)]
            )
            tracker.set_tags(
                run, {"trainflow.fate_detail": fate, "trainflow.fate": fate.split()[0]}
            )
            tracker.end_run(run)
            trials[name] = run
        tracker.end_run(sweep)
        tracker.end_run(parent)
        yield {"home": home, "tracker": tracker, "parent": parent, "sweep": sweep, "trials": trials}


def test_sweep_trials_reads_the_sweep_back(store):
    from training.tracking import sweep_runs

    tracker = store["tracker"]
    data = sweep_runs.sweep_trials(tracker)  # the latest sweep
    assert data["sweep_run_id"] == store["sweep"] and data["parent_run_id"] == store["parent"]
    assert data["parent_run_name"] == "pipeline-cmp-1" and data["experiment"] == EXPERIMENT
    assert (data["metric"], data["mode"], data["max_t"]) == ("val_accuracy", "max", "3")
    by_name = {t["name"]: t for t in data["trials"]}
    assert set(by_name) == set(store["trials"])
    assert by_name["trial 02 · lr=0.01"]["best_value"] == pytest.approx(0.95)  # best, not last
    assert by_name["trial 02 · lr=0.01"]["metrics"]["val_accuracy"] == pytest.approx(0.93)
    assert by_name["trial 01 · lr=0.0001"]["epochs"] == 1
    assert by_name["trial 01 · lr=0.0001"]["params"] == {"train.lr": "0.0001"}
    # the same sweep from the parent, the sweep or a trial run id
    for run_id in (store["parent"], store["sweep"], store["trials"]["trial 00 · lr=0.003"]):
        assert sweep_runs.sweep_trials(tracker, run_id)["sweep_run_id"] == store["sweep"]


def test_compare_url_of_a_local_store(store):
    from training.tracking import ui

    url = ui.compare_url(store["tracker"], ["a", "b"], ["7"])
    assert url.startswith("http://127.0.0.1:5000/#/compare-runs?runs=")
    query = urllib.parse.parse_qs(url.split("?", 1)[1])
    assert query == {"runs": ['["a","b"]'], "experiments": ['["7"]']}


def _compare(store, *args):
    env = {"TRAINFLOW_HOME": str(store["home"])}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        return CliRunner().invoke(app, ["compare", "--experiment", EXPERIMENT, *args], env=env)


def test_compare_command_prints_trials_best_first_and_the_compare_view(store):
    result = _compare(store)
    assert result.exit_code == 0, result.output
    out = result.output
    positions = [out.index(name) for name in ("trial 02", "trial 00", "trial 01")]
    assert positions == sorted(positions), out
    assert "stopped by ASHA at rung 1 (iteration 1 of 3)" in out
    assert "0.95" in out and "1/3" in out
    assert "mlflow ui --backend-store-uri sqlite:///" in out
    url = re.search(r"http://127\.0\.0\.1:5000/#/compare-runs\?\S+", out).group(0)
    runs = urllib.parse.parse_qs(url.split("?", 1)[1])["runs"][0]
    ordered = [store["trials"][n] for n in ("trial 02 · lr=0.01", "trial 00 · lr=0.003")]
    assert runs.startswith(f'["{ordered[0]}","{ordered[1]}"')


def test_compare_command_names_what_is_missing(store):
    result = _compare(store, "--run", "no-such-run")
    assert result.exit_code == 1
    assert "no-such-run" in result.output and "pipeline-cmp-1" in result.output
    assert "mlflow runs list --experiment-id" in result.output

    result = CliRunner().invoke(
        app, ["compare", "--experiment", "nope"], env={"TRAINFLOW_HOME": str(store["home"])}
    )
    assert result.exit_code == 1
    assert "'nope'" in result.output and EXPERIMENT in result.output


def test_compare_command_without_a_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = CliRunner().invoke(app, ["compare"], env={"TRAINFLOW_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "no MLflow store" in result.output and "trainflow run" in result.output
    assert not (tmp_path / "mlflow.db").exists()  # read-only: nothing created
