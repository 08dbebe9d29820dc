"""The benchmark harness: alternation, statistics, targets, result JSON, the docs table.

Fast and without Ray: nothing here runs a benchmark.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import BENCHMARKS, figure_specs, load  # noqa: E402
from benchmarks import doc_tables as dt  # noqa: E402
from benchmarks import harness as h  # noqa: E402
from benchmarks import memory_sampling as ms  # noqa: E402
from benchmarks import result_files as rf  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Alternation


def test_alternate_interleaves_arms_rep_by_rep():
    assert h.alternate(["A", "B"], 3) == [
        (0, "A"),
        (0, "B"),
        (1, "A"),
        (1, "B"),
        (2, "A"),
        (2, "B"),
    ]


def test_alternate_lets_an_arm_drop_out_after_its_reps():
    assert h.alternate(["asha", "full"], {"asha": 3, "full": 1}) == [
        (0, "asha"),
        (0, "full"),
        (1, "asha"),
        (2, "asha"),
    ]


def test_alternate_refuses_an_arm_without_reps():
    with pytest.raises(ValueError, match="at least one"):
        h.alternate(["A", "B"], {"A": 2, "B": 0})


def test_run_alternating_calls_arms_in_order_and_collects_per_arm():
    calls = []

    def arm(name):
        def run(rep):
            calls.append((name, rep))
            return {"value": rep * 10 + (name == "B")}

        return run

    samples = h.run_alternating({"A": arm("A"), "B": arm("B")}, 2)
    assert calls == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]
    assert samples == {"A": [{"value": 0}, {"value": 10}], "B": [{"value": 1}, {"value": 11}]}


# ---------------------------------------------------------------------------------------------
# Statistics and targets


def test_stats_median_and_spread_odd():
    s = h.stats([3.0, 1.0, 2.0])
    assert (s["n"], s["median"], s["min"], s["max"]) == (3, 2.0, 1.0, 3.0)
    assert s["spread"] == 2.0
    assert s["rel_spread"] == pytest.approx(1.0)
    assert s["samples"] == [3.0, 1.0, 2.0]  # run order kept


def test_stats_median_even_and_ignores_missing():
    s = h.stats([4, None, 1, float("nan"), 2, 3])
    assert s["n"] == 4
    assert s["median"] == 2.5
    assert s["spread"] == 3
    assert s["rel_spread"] == pytest.approx(3 / 2.5)


def test_stats_of_nothing():
    s = h.stats([])
    assert s["n"] == 0 and s["median"] is None and s["spread"] is None


def test_paired_ratios_pair_by_repetition():
    assert h.paired_ratios([2.0, 3.0, 8.0], [1.0, 2.0, 4.0]) == [2.0, 1.5, 2.0]
    with pytest.raises(ValueError, match="unpaired"):
        h.paired_ratios([1.0], [1.0, 2.0])


def test_pluck_skips_missing_values():
    assert h.pluck([{"a": 1}, {"b": 2}, {"a": None}, {"a": 3}], "a") == [1, 3]


@pytest.mark.parametrize(
    ("op", "bound", "value", "expected"),
    [
        (">=", 0.9, 0.9, True),
        (">=", 0.9, 0.89, False),
        ("<=", 1.5, 1.6, False),
        ("<=", 1.5, 1.5, True),
        ("<", 1, 1, False),
        (">", 1, 1.01, True),
    ],
)
def test_target_check(op, bound, value, expected):
    assert h.Target(op, bound).check(value) is expected


def test_target_unknown_operator_and_missing_value():
    with pytest.raises(ValueError, match="operator"):
        h.Target("=>", 1.0)
    assert h.Target(">=", 1.0).check(None) is None
    assert h.Target(">=", 1.0).check(math.nan) is None


def test_figure_value_is_the_median_and_pass_uses_it():
    fig = h.Figure("r", "ratio", "x", [0.8, 0.95, 0.92], target=h.Target(">=", 0.9, ">= 0.9"))
    out = fig.to_dict()
    assert out["value"] == 0.92
    assert out["pass"] is True
    assert out["target"] == {"op": ">=", "value": 0.9, "text": ">= 0.9"}
    assert out["stats"]["n"] == 3


def test_figure_without_samples_has_no_verdict():
    out = h.Figure("r", "ratio", "x", [], target=h.Target(">=", 0.9)).to_dict()
    assert out["value"] is None and out["pass"] is None


# ---------------------------------------------------------------------------------------------
# Result JSON


MACHINE = {"nproc": 2, "memory_gib": 23.5, "cpu_model": "AMD EPYC"}


def _result(bench_id="B2", samples=(0.5, 0.6, 0.7), smoke=False, error=None, errors=()):
    outcome = h.Outcome(
        figures=[
            h.Figure(
                "ratio_10x",
                "rows/s ratio",
                "x",
                list(samples),
                anchor="pyarrow",
                target=h.Target(">=", 0.8, ">= 0.8"),
            ),
            h.Figure("rows_per_s", "rows/s", "rows/s", [1000.0, 1100.0, 900.0]),
        ],
        samples={"ray": [{"seconds": 1.0}], "arrow": [{"seconds": float("nan")}]},
        params={"scales": [1, 10]},
        notes=["a note"],
        errors=list(errors),
    )
    return rf.make_result(
        bench_id,
        "title",
        outcome,
        smoke=smoke,
        duration_s=12.345,
        machine=MACHINE,
        error=error,
        suite_id="s1",
    )


def test_make_result_has_the_schema_fields_and_verdict():
    doc = _result()
    assert doc["schema"] == rf.SCHEMA
    assert doc["status"] == "ok" and doc["error"] is None
    assert doc["pass"] is False  # 0.6 < 0.8
    assert doc["duration_s"] == 12.35
    assert [f["key"] for f in doc["figures"]] == ["ratio_10x", "rows_per_s"]
    assert doc["date"][:4].isdigit()


def test_partial_failure_is_an_error_that_keeps_its_figures():
    doc = _result(errors=["flow arm: boom"])
    assert doc["status"] == "error" and doc["error"] == "flow arm: boom"
    assert doc["figures"]
    assert rf.validate_result(rf._jsonable(doc)) == []


def test_write_result_round_trips_strict_json(tmp_path):
    path = rf.write_result(_result(), tmp_path)
    assert path == tmp_path / "B2.json"
    text = path.read_text()
    assert "NaN" not in text  # NaN became null: the file is strict JSON
    doc = json.loads(text)
    assert rf.validate_result(doc) == []
    assert doc["samples"]["arrow"][0]["seconds"] is None
    assert rf.load_results(tmp_path) == {"B2": doc}


def test_validate_result_names_what_is_wrong():
    doc = _result()
    del doc["machine"]["cpu_model"]
    doc["figures"][0]["pass"] = "yes"
    doc["status"] = "error"
    problems = rf.validate_result(doc)
    assert any("cpu_model" in p for p in problems)
    assert any("pass" in p for p in problems)
    assert any("without an error message" in p for p in problems)
    assert rf.validate_result({"id": "B1"})  # missing nearly everything


def test_write_result_refuses_an_invalid_document(tmp_path):
    doc = _result()
    doc["figures"] = "not a list"
    with pytest.raises(ValueError, match="invalid result"):
        rf.write_result(doc, tmp_path)
    assert not (tmp_path / "B2.json").exists()


def test_load_results_skips_broken_files(tmp_path):
    (tmp_path / "B1.json").write_text("{not json")
    (tmp_path / "B3.json").write_text(json.dumps({"id": "B3"}))
    rf.write_result(_result(), tmp_path)
    assert set(rf.load_results(tmp_path)) == {"B2"}


def test_machine_info_names_cpus_memory_and_model():
    info = rf.machine_info()
    assert info["nproc"] >= 1
    assert info["cpu_model"]
    assert info["memory_gib"] is None or info["memory_gib"] > 0
    assert "torch" in info["versions"]
    assert "CPU" in rf.machine_label(info)


# ---------------------------------------------------------------------------------------------
# The docs table


SPECS = [
    h.FigureSpec("B2", "ratio_10x", "rows/s ratio at 10x", ">= 0.8", "pyarrow"),
    h.FigureSpec("B2", "ratio_1x", "rows/s ratio at 1x", "—", "pyarrow"),
    h.FigureSpec("B6", "bookkeeping_ratio", "wall ÷ minimum", "<= 1.2", "N x t / CPUs"),
]


def _rows(table: str) -> list[list[str]]:
    lines = table.strip().splitlines()[2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_table_without_results_says_not_yet_measured():
    rows = _rows(dt.render_table(SPECS, {}))
    assert [r[0] for r in rows] == ["B2", "B2", "B6"]
    assert all(r[4] == dt.NOT_MEASURED for r in rows)
    assert rows[0][2] == ">= 0.8" and rows[0][3] == "pyarrow"


def test_table_shows_measured_value_spread_verdict_date_machine():
    rows = _rows(dt.render_table(SPECS, {"B2": _result()}))
    ratio = rows[0]
    assert ratio[4] == "0.60x (n=3, 0.50–0.70)"
    assert ratio[5] == "FAIL"
    assert ratio[6] == _result()["date"][:10]
    assert ratio[7].startswith("2 CPU, 23.5 GiB")
    assert rows[1][4] == dt.NOT_MEASURED  # a spec'd figure the result lacks
    # A figure the specs do not list is still shown, after the benchmark's spec'd rows.
    assert rows[2][:2] == ["B2", "rows/s"]
    assert rows[2][4] == "1,000 rows/s (n=3, 900–1,100)"
    assert rows[2][3] == "—"  # no anchor
    assert rows[3][0] == "B6" and rows[3][4] == dt.NOT_MEASURED


def test_table_ignores_smoke_results_unless_asked():
    smoke = {"B2": _result(smoke=True)}
    assert _rows(dt.render_table(SPECS, smoke))[0][4] == dt.NOT_MEASURED
    shown = _rows(dt.render_table(SPECS, smoke, include_smoke=True))[0][4]
    assert shown.endswith("[smoke]")


def test_table_reports_a_failed_benchmark():
    failed = rf.make_result(
        "B6", "t", None, smoke=False, duration_s=1, machine=MACHINE, error="timed out after 60 s"
    )
    row = _rows(dt.render_table(SPECS, {"B6": failed}))[-1]
    assert row[4].startswith("error: timed out")


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.756, "x", "0.76x"),
        (12.0, "%", "12.0%"),
        (1234.5, "samples/s", "1,234 samples/s"),
        (3.14159, "s", "3.14 s"),
        (None, "s", "n/a"),
        (250.4, "MiB", "250 MiB"),
    ],
)
def test_format_value(value, unit, text):
    assert dt.format_value(value, unit) == text


def test_update_docs_replaces_only_between_markers_and_is_idempotent(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(
        f"# Title\n\nintro\n\n{dt.TABLE_START}\nold table\n{dt.TABLE_END}\n\n## After\n\n"
        f"{dt.STAGES_START}\nold stages\n{dt.STAGES_END}\ntail\n"
    )
    first = dt.update_docs(docs, SPECS, {"B2": _result()})
    assert "old table" not in first and "old stages" not in first
    assert first.startswith("# Title\n\nintro\n\n") and first.endswith("tail\n")
    assert "## After" in first
    assert dt.update_docs(docs, SPECS, {"B2": _result()}) == first


def test_update_docs_appends_markers_when_missing(tmp_path):
    docs = tmp_path / "new.md"
    text = dt.update_docs(docs, SPECS, {}, template="# Benchmarks\n")
    assert text.startswith("# Benchmarks\n")
    assert dt.TABLE_START in text and dt.TABLE_END in text and dt.STAGES_START in text


def test_a_marker_block_runs_from_its_start_to_the_next_end_and_may_be_appended():
    start, end = "<!-- t:start -->", "<!-- t:end -->"
    text = f"{end}\nhead\n{start}\nold\n{end}\ntail\n"
    assert (
        dt.replace_between(text, start, end, "new") == f"{end}\nhead\n{start}\nnew\n{end}\ntail\n"
    )
    assert dt.block_between(text, start, end) == "old"
    with pytest.raises(ValueError, match="markers"):
        dt.replace_between("no block\n", start, end, "new")
    appended = dt.replace_between("no block\n", start, end, "new", append=True)
    assert appended == f"no block\n\n{start}\nnew\n{end}\n"


def test_a_cell_cannot_break_its_row():
    assert dt.table_row(["a|b", "two\nlines", 3]) == "| a\\|b | two lines | 3 |"


def test_stage_table_rendering():
    assert dt.NOT_MEASURED in dt.render_stages(None)
    b4 = {
        "smoke": False,
        "extra": {
            "stage_table": [
                {"part": "stage sweep", "wall_s": 20.0, "work_s": 19.0, "overhead_s": 1.0},
                {"part": "total", "wall_s": 100.0, "work_s": 70.0, "overhead_s": 30.0},
            ]
        },
    }
    lines = dt.render_stages(b4).splitlines()
    assert lines[2] == "| stage sweep | 20.0 | 19.0 | 1.0 |"
    assert lines[-1] == "| total | 100.0 | 70.0 | 30.0 |"


# ---------------------------------------------------------------------------------------------
# Memory sampling


def test_peak_sampler_sees_this_process_and_survives_a_failing_gauge():
    calls = []

    def gauge():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("flaky")
        return float(len(calls))

    with ms.PeakSampler(interval=0.01, extra=gauge) as sampler:
        block = bytearray(32 * 1024**2)  # touched: RSS grows
        for i in range(0, len(block), 4096):
            block[i] = 1
        deadline = time.monotonic() + 30
        while len(sampler.series) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(sampler.series) >= 4
    assert sampler.peak_rss > 32 * 1024**2
    # This process alone: its PSS is its RSS less the shared pages' other mappers' shares.
    assert 32 * 1024**2 < sampler.peak_pss <= sampler.peak_rss
    assert sampler.peak_procs >= 1
    assert sampler.cpu_seconds > 0
    assert sampler.peak_extra == max(s.extra for s in sampler.series if s.extra is not None)
    assert len(sampler.thin_series(2)) <= len(sampler.series)


# ---------------------------------------------------------------------------------------------
# The registry, the CLI and the B4 arithmetic


def test_every_benchmark_module_has_the_interface():
    assert list(BENCHMARKS) == [f"B{i}" for i in range(1, 13)]
    for bench_id in BENCHMARKS:
        module = load(bench_id)
        assert bench_id == module.ID
        assert module.TITLE and callable(module.run)
        full, smoke = module.TIMEOUT_S
        assert full >= smoke > 0
        keys = [spec.key for spec in module.FIGURES]
        assert len(keys) == len(set(keys)), bench_id
        assert all(spec.bench_id == bench_id for spec in module.FIGURES)
        assert any(spec.target not in ("—", "") for spec in module.FIGURES), bench_id
    assert load("b2").ID == "B2"
    with pytest.raises(ValueError, match="unknown benchmark"):
        load("B13")


def test_importing_the_benchmarks_starts_nothing_heavy():
    code = (
        "import json, sys; import benchmarks; benchmarks.figure_specs(); "
        "import benchmarks.__main__; "
        "print(json.dumps(sorted(m for m in ('ray', 'torch', 'prefect', 'mlflow') "
        "if m in sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_cli_selection_and_output_dirs():
    from benchmarks import __main__ as cli

    assert cli._selection("") == list(BENCHMARKS)
    assert cli._selection("b3, B1") == ["B1", "B3"]  # run in suite order
    with pytest.raises(ValueError, match="unknown benchmark"):
        cli._selection("B1,B13")
    assert cli._out_dir(cli._parse([])) == cli.RESULTS_DIR
    assert cli._out_dir(cli._parse(["--smoke"])) == cli.RESULTS_DIR / "smoke"
    with pytest.raises(SystemExit):
        cli._parse(["--reps", "0"])


def test_docs_table_matches_the_committed_results():
    """docs/benchmark-figures.md's table is what the harness renders from benchmarks/results/."""
    docs = (REPO_ROOT / "docs" / "benchmark-figures.md").read_text()
    results = rf.load_results(REPO_ROOT / "benchmarks" / "results")
    table = dt.render_table(figure_specs(), results)
    assert f"{dt.TABLE_START}\n{table}\n{dt.TABLE_END}" in docs
    assert dt.STAGES_START in docs and dt.STAGES_END in docs


def test_b4_splits_wall_time_into_parts_and_work():
    from benchmarks import b4_orchestration as b4

    t0 = 1000.0
    spans = {
        "flow_call": [[t0 + 5, t0 + 95]],
        "mlflow:configure": [[t0 + 12, t0 + 13], [t0 + 30, t0 + 30.5]],
        "flow:artifact": [[t0 + 91, t0 + 91.2], [t0 + 93, t0 + 94]],
        "flow:report": [[t0 + 90.5, t0 + 92.5]],
        "task:inspect_data": [[t0 + 15, t0 + 16]],
        "task:preprocess": [[t0 + 16.5, t0 + 25]],
        "task:sweep": [[t0 + 26, t0 + 40]],
        "task:train": [[t0 + 41, t0 + 70]],
        "task:evaluate": [[t0 + 71, t0 + 80]],
        "task:promote": [[t0 + 81, t0 + 90]],
        "lib:preprocess": [[t0 + 20, t0 + 24]],
        "lib:sweep": [[t0 + 27, t0 + 39]],
        "ray:connect": [[t0 + 17, t0 + 20]],
    }
    run = {
        "wall_s": 100.0,
        "popen": t0,
        "exit": t0 + 100,
        "timings": {"marks": {"instrumented": t0 + 3}, "spans": spans},
        "summary": {
            "stage_seconds": {
                "preprocess": 10.5,
                "sweep": 15,
                "train": 30,
                "evaluate": 9.5,
                "promote": 10,
            },
            "sweep": {"epochs_spent": 40},
            "test_metrics": {"test_accuracy": 0.9},
        },
    }
    a = b4.analyse(run)
    assert a["work_s"] == pytest.approx(1 + 8.5 + 14 + 29 + 9 + 9 + 2)  # tasks + report
    assert a["overhead_s"] == pytest.approx(100 - a["work_s"])
    assert a["overhead_pct"] == pytest.approx(a["overhead_s"])  # wall is 100 s
    assert a["prefect_start_s"] == pytest.approx(7)  # flow call at +5, body at +12
    assert a["ray_start_s"] == pytest.approx(3)
    assert sum(p["wall_s"] for p in a["parts"]) == pytest.approx(100)
    parts = {p["part"]: p for p in a["parts"]}
    assert parts["stage sweep"]["overhead_s"] == pytest.approx(1)
    assert parts["exit: summary, JSON, server stop, interpreter exit"]["wall_s"] == 5
    after = next(p for name, p in parts.items() if name.startswith("after the stages"))
    assert after["wall_s"] == pytest.approx(4)  # last task end +90 to the last artifact +94
    assert after["work_s"] == pytest.approx(2)
    table = b4.stage_table([a, a, a])
    assert table[-1]["wall_s"] == 100 and table[-1]["overhead_s"] == pytest.approx(a["overhead_s"])


def test_b1_steady_state_skips_the_first_epoch():
    from benchmarks.b1_training_throughput import _steady

    sps, seconds = _steady([10.0, 14.0, 18.0], [1000, 1000, 1000], world_size=2)
    assert seconds == 8.0
    assert sps == pytest.approx(2 * 2000 / 8.0)
    with pytest.raises(RuntimeError, match="2 epochs"):
        _steady([10.0], [1000], 1)


def test_b4_mid_sweep_kill_condition(tmp_path):
    from benchmarks.b4_orchestration import mid_sweep

    sweep = tmp_path / "storage" / "runs" / "r1" / "sweep"
    check = mid_sweep(2)
    assert not check(tmp_path, "r1")
    for i in range(3):
        (sweep / f"trial_{i}").mkdir(parents=True)
    (sweep / "trial_0" / "result.json").write_text('{"epoch": 1}\n')
    (sweep / "trial_1" / "result.json").write_text('{"epoch": 1}\n')
    (sweep / "trial_2" / "result.json").write_text("")
    assert not check(tmp_path, "r1")  # no saved experiment state yet: a kill could not resume
    (sweep / "experiment_state-x.json").write_text("{}")
    assert check(tmp_path, "r1")


def test_memory_over_time_is_drawn_and_kept_as_data(tmp_path):
    from benchmarks.memory_plot import GIB, write_memory_over_time

    runs = {
        "1,000,000 rows": [(0.0, 1 * GIB, GIB // 2, None), (1.0, 2 * GIB, GIB, None)],
        "10,000,000 rows": [(0.0, 1 * GIB, GIB // 2, None), (5.0, 3 * GIB, 2 * GIB, None)],
    }
    png, data = write_memory_over_time(runs, tmp_path / "docs", "scale-memory-local")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(data.read_text()) == {
        "1,000,000 rows": [[0.0, GIB, GIB // 2], [1.0, 2 * GIB, GIB]],
        "10,000,000 rows": [[0.0, GIB, GIB // 2], [5.0, 3 * GIB, 2 * GIB]],
    }
