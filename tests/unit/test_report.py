"""training.report: real PNG files, the series each plot shows, trial names and fates, the
self-contained HTML report (its jinja2 template), the markdown artifacts and the typed
RunSummary, all on synthetic run data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from training.config import AshaConfig, PipelineConfig
from training.report import html, markdown, sweep_plots, trials
from training.report.plots import (
    confusion_matrix_png,
    evaluation_plots,
    learning_curves_png,
    per_class_figure,
    pyplot,
)
from training.summary import DataSummary, MlflowSummary, ModelSummary, RunSummary
from training.tune import trials as named
from training.tune.outcome import SweepOutcome, TrialSummary

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 1000) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes


def test_confusion_matrix_png(tmp_path):
    matrix = np.diag([10] * 10) + 1
    out = confusion_matrix_png(matrix, [str(i) for i in range(10)], str(tmp_path / "a" / "cm.png"))
    assert out == str(tmp_path / "a" / "cm.png")
    assert_png(out)


def test_confusion_matrix_from_lists(tmp_path):
    out = confusion_matrix_png([[5, 1], [2, 7]], ["cat", "dog"], str(tmp_path / "cm.png"))
    assert_png(out)


def test_confusion_matrix_shape_mismatch(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        confusion_matrix_png([[1, 2], [3, 4]], ["a", "b", "c"], str(tmp_path / "bad.png"))
    assert not (tmp_path / "bad.png").exists()


def test_learning_curves_png(tmp_path):
    history = [
        {"epoch": e, "train_loss": 1 / e, "val_loss": 1.2 / e, "val_accuracy": 1 - 0.5 / e}
        for e in range(1, 6)
    ]
    history[2]["val_loss"] = float("nan")  # skipped, not plotted
    out = learning_curves_png(history, str(tmp_path / "curves.png"))
    assert_png(out)


def test_learning_curves_empty_history(tmp_path):
    assert_png(learning_curves_png([], str(tmp_path / "empty.png")), min_bytes=100)


# ---------------------------------------------------------------- sweep trials: names and fates


ASHA = AshaConfig(max_t=4, grace_period=1, reduction_factor=2)


def _history(epochs: int, start: float) -> list[dict]:
    return [
        {
            "epoch": e,
            "train_loss": 2.0 / e,
            "val_loss": 2.2 / e,
            "val_accuracy": min(0.99, start + 0.1 * e),
        }
        for e in range(1, epochs + 1)
    ]


def synthetic_sweep() -> SweepOutcome:
    """4 trials over two params: one completed (the best), two stopped by ASHA at rungs 1 and 2,
    one errored."""
    trials = [
        ("abc12_00000", 0.0031, 64, "completed", 4, None),
        ("abc12_00001", 0.0002, 32, "stopped-early", 1, None),
        ("abc12_00002", 0.0009, 128, "stopped-early", 2, None),
        ("abc12_00003", 0.02, 64, "errored", 1, "RuntimeError: boom"),
    ]
    rows = []
    for k, (trial_id, lr, bs, status, epochs, error) in enumerate(trials):
        history = _history(epochs, 0.5 - 0.1 * k)
        rows.append(
            TrialSummary(
                trial_id=trial_id,
                params={"train.lr": lr, "train.batch_size": bs},
                status=status,
                epochs=epochs,
                metrics={k: v for k, v in history[-1].items() if k != "epoch"},
                error=error,
                history=history,
            )
        )
    return SweepOutcome(
        best_trial_id="abc12_00000",
        best_params={"train.lr": 0.0031, "train.batch_size": 64},
        best_metric=rows[0].metrics["val_accuracy"],
        metric="val_accuracy",
        trials=rows,
        epochs_spent=8,
        epochs_budget=16,
    )


def legend_lines(ax) -> list:
    """The plotted series of an axes (helper lines such as rung markers are labelled "_...")."""
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_trial_run_name_has_number_and_params():
    name = named.trial_run_name("f3f1c_00003", {"train.lr": 0.0031234, "train.batch_size": 64})
    assert name == "trial 03 · lr=0.0031 bs=64"
    assert named.trial_run_name("x_00012", {}, width=3) == "trial 012"
    assert named.trial_run_name("weird", {"model.hidden_sizes": [128, 64]}) == (
        "trial weird · hidden=128x64"
    )
    assert len(named.trial_run_name("t_00001", {"k": "v" * 400})) == named.MAX_RUN_NAME


def test_asha_milestones_mirror_ray():
    assert named.asha_milestones(3, 1, 2) == [1, 2]
    assert named.asha_milestones(10, 1, 3) == [1, 3, 9]
    assert named.asha_milestones(10, 2, 2) == [2, 4, 8]
    assert named.asha_milestones(4, 4, 2) == [4]


def test_fate_detail_names_the_rung():
    milestones = named.asha_milestones(4, 1, 2)  # [1, 2, 4]
    assert named.fate_detail("stopped-early", 2, 4, milestones) == (
        "stopped by ASHA at rung 2 (iteration 2 of 4)"
    )
    assert named.fate_detail("stopped-early", 3, 4, milestones) == (
        "stopped early at iteration 3 of 4"
    )
    assert named.fate_detail("completed", 4, 4, milestones) == "completed all 4 iterations"
    assert named.fate_detail("errored", 1, 4, milestones, "boom") == "errored at iteration 1: boom"


def test_trial_rows_and_saving():
    rows = named.trial_rows(synthetic_sweep(), ASHA)
    assert [r.name for r in rows] == [
        "trial 00 · lr=0.0031 bs=64",
        "trial 01 · lr=0.0002 bs=32",
        "trial 02 · lr=0.0009 bs=128",
        "trial 03 · lr=0.02 bs=64",
    ]
    assert [r.rung for r in rows] == [None, 1, 2, None]
    assert [r.best for r in rows] == [True, False, False, False]
    assert rows[1].fate == "stopped by ASHA at rung 1 (iteration 1 of 4)"
    assert [r.trial.trial_id for r in rows] == [t.trial_id for t in synthetic_sweep().trials]
    assert named.sweep_saving(synthetic_sweep()) == pytest.approx(0.5)
    assert named.sweep_saving(SweepOutcome(None, {}, None, "val_accuracy")) is None


def test_fates_and_swept_params():
    sweep = synthetic_sweep()
    assert named.count_fates(sweep.trials) == {
        "completed": 1,
        "errored": 1,
        "stopped-early": 2,
    }
    assert trials.swept_params(sweep.trials) == ["train.lr", "train.batch_size"]
    assert trials.fmt(0.123456) == "0.1235" and trials.fmt(3) == "3" and trials.fmt(None) == "None"


# ------------------------------------------------------------------------------------ sweep plots


def test_sweep_curves_one_series_per_trial_and_stopped_ones_cut_short():
    rows = named.trial_rows(synthetic_sweep(), ASHA)
    fig = sweep_plots.sweep_curves_figure(rows, 4, named.asha_milestones(4, 1, 2))
    try:
        axes = fig.get_axes()
        assert [ax.get_title() for ax in axes] == ["val_accuracy", "val_loss"]
        for ax in axes:
            lines = legend_lines(ax)
            assert len(lines) == 4
            ends = {line.get_label(): max(line.get_xdata()) for line in lines}
            assert ends["trial 00 · lr=0.0031 bs=64"] == 4
            assert ends["trial 01 · lr=0.0002 bs=32 (stopped at rung 1)"] == 1
            assert ends["trial 02 · lr=0.0009 bs=128 (stopped at rung 2)"] == 2
            styles = {line.get_label(): line.get_linestyle() for line in lines}
            assert styles["trial 00 · lr=0.0031 bs=64"] == "-"
            assert styles["trial 01 · lr=0.0002 bs=32 (stopped at rung 1)"] == "--"
            # every stopped or errored trial ends in a cross, and the x axis spans max_t
            assert sum(1 for line in ax.get_lines() if line.get_label() == "_cut") == 3
            assert ax.get_xlim()[1] > 4
    finally:
        pyplot().close(fig)


def test_asha_rungs_bars_count_trials_alive():
    rows = named.trial_rows(synthetic_sweep(), ASHA)
    fig = sweep_plots.asha_rungs_figure(rows, 4, [1, 2, 4], 8, 16)
    try:
        ax = fig.get_axes()[0]
        assert [p.get_height() for p in ax.patches] == [4, 2, 1, 1]
        assert "50% saved" in ax.get_title()
        texts = [t.get_text() for t in ax.texts]
        assert "rung 1\n1 stopped" in texts and "rung 2\n1 stopped" in texts
    finally:
        pyplot().close(fig)


def test_param_metric_scatter_one_series_per_fate():
    rows = named.trial_rows(synthetic_sweep(), ASHA)
    fig = sweep_plots.param_metric_figure(rows, "train.lr")
    try:
        ax = fig.get_axes()[0]
        labels = ax.get_legend_handles_labels()[1]
        assert labels == ["completed", "stopped-early", "errored", "best"]
        assert ax.get_xscale() == "log"  # 0.0002 .. 0.02 spans 100x
        sizes = [len(c.get_offsets()) for c in ax.collections]
        assert sizes == [1, 2, 1, 1]
    finally:
        pyplot().close(fig)
    fig = sweep_plots.param_metric_figure(rows, "train.batch_size")
    try:
        assert fig.get_axes()[0].get_xscale() == "linear"
    finally:
        pyplot().close(fig)


def test_per_class_bars():
    per_class = [
        {"class": str(i), "precision": 0.9, "recall": 0.8 + i / 100, "f1": 0.85, "support": 5}
        for i in range(10)
    ]
    fig = per_class_figure(per_class)
    try:
        ax = fig.get_axes()[0]
        assert [c.get_label() for c in ax.containers] == ["precision", "recall"]
        assert all(len(c) == 10 for c in ax.containers)
    finally:
        pyplot().close(fig)


def test_sweep_plots_write_every_png(tmp_path):
    plots = sweep_plots.sweep_plots(synthetic_sweep(), ASHA, str(tmp_path))
    assert set(plots) == {
        "sweep_curves.png",
        "asha_rungs.png",
        "param_train_lr.png",
        "param_train_batch_size.png",
    }
    for path in plots.values():
        assert_png(path)


def test_sweep_plots_with_empty_histories(tmp_path):
    sweep = synthetic_sweep()
    for trial in sweep.trials:
        trial.history = []
    for path in sweep_plots.sweep_plots(sweep, ASHA, str(tmp_path)).values():
        assert_png(path, min_bytes=100)


def test_evaluation_plots(tmp_path):
    per_class = [
        {"class": c, "precision": 0.5, "recall": 0.7, "f1": 0.6, "support": 3} for c in "ab"
    ]
    plots = evaluation_plots(per_class, [[3, 0], [1, 2]], ["a", "b"], str(tmp_path))
    assert set(plots) == {"confusion_matrix.png", "per_class.png"}
    for path in plots.values():
        assert_png(path)


# -------------------------------------------------------------------------------- the HTML report


def synthetic_summary() -> RunSummary:
    return RunSummary(
        run_id="abc123",
        data=DataSummary(
            source="builtin:digits",
            fingerprint="f00d",
            rows={"train": 1200, "val": 300, "test": 297},
            preprocess_cached=False,
        ),
        sweep=synthetic_sweep(),
        test_metrics={"test_accuracy": 0.95, "test_macro_f1": 0.94, "test_loss": 0.2},
        mlflow=MlflowSummary(
            tracking_uri="sqlite:///x/mlflow.db",
            experiment="exp <1>",
            experiment_id="1",
            parent_run_id="p123",
            train_run_id="t123",
            ui_command="mlflow ui --backend-store-uri sqlite:///x/mlflow.db",
            run_url="http://127.0.0.1:5000/#/experiments/1/runs/p123?workflowType=machine_learning",
        ),
        model=ModelSummary(
            name="digits",
            version="3",
            model_uri="models:/digits/3",
            logged_model_uri="models:/m-abc",
            source_run_id="t123",
            state_file="extra_files/model_state.pt",
            decision="kept-champion",
            champion_version="2",
            challenger_version="3",
            challenger_value=0.95,
            champion_value=0.96,
            aliases=["challenger"],
        ),
        checkpoint="/x/checkpoint",
        storage="/x/runs/abc123",
        stage_seconds={"preprocess": 1.0, "sweep": 10.0},
    )


PER_CLASS = [{"class": c, "precision": 0.5, "recall": 0.7, "f1": 0.6, "support": 3} for c in "ab"]


def report_config(**overrides) -> PipelineConfig:
    """The config shown in the report: the synthetic sweep's ASHA settings."""
    return PipelineConfig().with_overrides(
        {
            "sweep.asha.max_t": ASHA.max_t,
            "sweep.asha.grace_period": ASHA.grace_period,
            "sweep.asha.reduction_factor": ASHA.reduction_factor,
            **overrides,
        }
    )


def _plot_inputs(summary: RunSummary) -> dict:
    """What `report_plots` draws a classifier's run from: the synthetic sweep, 2 classes."""
    return dict(
        sweep=summary.sweep,
        asha=ASHA,
        train_history=_history(3, 0.5),
        per_class=PER_CLASS,
        confusion=[[3, 0], [1, 2]],
        class_names=["a", "b"],
    )


def test_report_html_has_every_section_and_embedded_images(tmp_path):
    summary = synthetic_summary()
    plots = html.report_plots(str(tmp_path), **_plot_inputs(summary))
    assert len(plots) == 7  # curves, rungs, 2 params, train curves, confusion, per-class
    page = html.report_html(
        summary,
        report_config(**{"train.lr": 0.01}),
        plots,
        per_class=PER_CLASS,
        links={"parent run": "http://127.0.0.1:5000/#/experiments/1/runs/p123"},
    )
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for section in html.REPORT_SECTIONS:
        assert f'<section id="{section}">' in page, section
    assert page.count('src="data:image/png;base64,') == len(plots)
    # every trial with its readable name and fate; the best one highlighted, first
    assert '<tr class="best"><td>trial 00 · lr=0.0031 bs=64</td>' in page
    assert "stopped by ASHA at rung 2 (iteration 2 of 4)" in page
    assert "errored at iteration 1: RuntimeError: boom" in page
    assert "8 / 16 (50% saved by ASHA)" in page
    assert "1 completed, 2 stopped-early, 1 errored" in page
    assert "gate decision: kept-champion" in page
    assert "exp &lt;1&gt;" in page  # escaped
    assert "lr: 0.01" in page and "builtin:digits" in page and "test_macro_f1" in page
    assert '<a href="http://127.0.0.1:5000/#/experiments/1/runs/p123">parent run</a>' in page
    for title in plots:
        assert f'alt="{title}"' in page


def test_report_takes_the_plots_the_stages_logged_and_draws_only_what_is_missing(
    tmp_path, monkeypatch
):
    inputs = _plot_inputs(synthetic_summary())
    drawn = html.report_plots(str(tmp_path / "stages"), **inputs)
    logged = {Path(path).name: path for path in drawn.values()}
    assert len(logged) == 7

    def no_drawing(*args, **kwargs):
        raise AssertionError("drew a plot that was logged")

    for name in ("sweep_plots", "learning_curves_png", "evaluation_plots"):
        monkeypatch.setattr(html, name, no_drawing)
    assert html.report_plots(str(tmp_path / "report"), **inputs, logged=logged) == drawn
    # A stage whose plots were not all logged (a run resumed after a kill) is drawn again.
    monkeypatch.undo()
    del logged["per_class.png"]
    again = html.report_plots(str(tmp_path / "report"), **inputs, logged=logged)
    assert again.keys() == drawn.keys()
    redrawn = {caption for caption in again if again[caption] != drawn[caption]}
    assert redrawn == {
        "evaluation: confusion matrix (test split)",
        "evaluation: per-class precision and recall",
    }
    assert all(again[caption].startswith(str(tmp_path / "report")) for caption in redrawn)


def test_report_html_tables_row_by_row():
    """The template's tables: headline, trials best first with every swept value, per-class
    scores, the gate and the stage seconds."""
    page = html.report_html(synthetic_summary(), report_config(), {}, per_class=PER_CLASS)
    assert "<tr><th>best trial</th><td>trial 00 · lr=0.0031 bs=64</td></tr>" in page
    assert "<tr><th>test accuracy</th><td>0.95</td></tr>" in page
    assert "<tr><th>model version</th><td>digits version 3</td></tr>" in page
    assert "<tr><th>rows test</th><td>297</td></tr>" in page
    assert "<tr><th>preprocessing</th><td>computed</td></tr>" in page
    names = [
        line.split("<td>")[1].split("</td>")[0]
        for line in page.splitlines()
        if line.startswith(("<tr><td>trial", '<tr class="best"><td>trial'))
    ]
    # val_accuracy falls with the trial number in the synthetic sweep: best first is trial order
    assert [n.split(" ·")[0] for n in names] == ["trial 00", "trial 01", "trial 02", "trial 03"]
    assert "<th>train.lr</th><th>train.batch_size</th>" in page
    assert "<td>0.0009</td><td>128</td>" in page
    assert '<tr><td>a</td><td class="num">0.5</td><td class="num">0.7</td>' in page
    assert "<tr><th>champion&#39;s value before</th><td>0.96</td></tr>" in page
    assert "<tr><th>champion now</th><td>version 2</td></tr>" in page
    assert "<tr><th>aliases of this version</th><td>challenger</td></tr>" in page
    assert "<tr><th>seconds: sweep</th><td>10</td></tr>" in page
    assert "<ul>" not in page  # no links given


def test_report_html_escapes_every_value():
    summary = synthetic_summary()
    summary.run_id = "<script>alert(1)</script>"
    summary.sweep.trials[3].error = 'x" onmouseover="y'
    page = html.report_html(summary, report_config(), {}, links={"a<b": 'http://h/"q'})
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'x" onmouseover' not in page and "x&#34; onmouseover=&#34;y" in page
    assert '<a href="http://h/&#34;q">a&lt;b</a>' in page


def test_report_html_redacts_credentials_in_the_config():
    config = report_config(**{"mlflow.tracking_uri": "http://user:secret@mlflow:5000"})
    page = html.report_html(synthetic_summary(), config, {})
    assert "secret" not in page and "http://***@mlflow:5000" in page


def test_report_html_without_sweep():
    summary = synthetic_summary()
    summary.sweep = None
    page = html.report_html(summary, PipelineConfig(), {})
    assert "No sweep" in page and "best trial" not in page
    assert '<section id="plots">' in page and "data:image/png" not in page


def test_the_template_ships_with_the_package():
    """An installed (non-editable) trainflow finds the template: it is package data."""
    from importlib import resources

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    template = resources.files("training.report") / "templates" / html.TEMPLATE
    assert template.is_file()
    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "templates/*.j2" in setuptools["package-data"]["training.report"]
    from setuptools import find_packages

    shipped = find_packages(root, include=setuptools["packages"]["find"]["include"])
    assert {"training.report", "training.loop", "training.data"} <= set(shipped)


def test_report_markdown_points_at_the_report():
    text = markdown.report_markdown(
        synthetic_summary(), "http://h/#/experiments/1/runs/p/artifactPath/report.html"
    )
    assert "artifactPath/report.html" in text
    assert "kept-champion" in text and "50% saved" in text
    assert "- test: test_accuracy = 0.95, test_macro_f1 = 0.94, test_loss = 0.2" in text


def test_summary_markdown_has_every_part():
    text = markdown.summary_markdown(synthetic_summary())
    assert text.startswith("# trainflow run `abc123`")
    assert "| test | 297 |" in text
    assert "## Sweep: best trial `abc12_00000`, val_accuracy = 0.9" in text
    assert "| train.lr | 0.0031 |" in text
    assert "Trials: 1 completed, 1 errored, 2 stopped-early; epochs 8 of a 16 budget." in text
    assert "| test_accuracy | 0.95 |" in text
    assert "gate: **kept-champion**, aliases: challenger, champion: version 2" in text
    assert "| sweep | 10.0 |" in text
    summary = synthetic_summary()
    summary.sweep = None
    assert "## Sweep" not in markdown.summary_markdown(summary)


def test_counts_read_as_whole_numbers_in_every_medium(tmp_path):
    """MLflow keeps every metric as a float: test_rows 44944.0 reads 44,944, as the summary's
    row counts do, on the console, in the markdown artifacts and in the HTML report."""
    from trainflow.render import summary_lines

    summary = synthetic_summary()
    summary.data.rows = {"train": 179_776, "val": 44_944, "test": 44_944}
    summary.test_metrics = {"test_accuracy": 0.95, "test_rows": 44944.0, "test_tokens": 1.2e6}
    (line,) = [line for line in summary_lines(summary) if line.startswith("test ")]
    assert line.endswith("test_accuracy 0.95 · test_rows 44,944 · test_tokens 1,200,000")
    text = markdown.summary_markdown(summary)
    assert "| test_rows | 44,944 |" in text and "| val | 44,944 |" in text
    assert "test_rows = 44,944, test_tokens = 1,200,000" in markdown.report_markdown(summary, "x")
    assert "test_rows = 44,944" in markdown.parent_run_note(summary, {})
    page = html.report_html(summary, report_config(), {}, per_class=PER_CLASS)
    assert "<tr><th>test_rows</th><td>44,944</td></tr>" in page
    assert "<tr><th>rows train</th><td>179,776</td></tr>" in page
    assert "e+0" not in " ".join([*summary_lines(summary), text, page])


def test_only_whole_counts_lose_their_decimals():
    assert trials.fmt_metric(44944.0, "test_rows") == "44,944"
    assert trials.fmt_metric(3, "support") == "3"
    assert trials.fmt_metric(12.5, "test_rows") == "12.5"  # not a whole number: as it is
    assert trials.fmt_metric(44944.0, "test_perplexity") == "4.494e+04"  # not a count
    assert trials.fmt_metric(1.0, "test_accuracy") == "1"
    assert trials.fmt_metric("a / b", "epochs spent / budget") == "a / b"


LOCAL_RUN_LINK = "http://127.0.0.1:5000/#/experiments/1/runs/p123?workflowType=machine_learning"


def test_every_ui_pointer_links_into_the_training_view():
    """The console summary and the Prefect artifact give a link carrying
    workflowType=machine_learning; for a local store after the command that starts the UI."""
    from trainflow.render import summary_lines

    summary = synthetic_summary()
    text = markdown.summary_markdown(summary)
    assert "- Start the MLflow UI: `mlflow ui --backend-store-uri sqlite:///x/mlflow.db`" in text
    assert f"- Then open the run: [{LOCAL_RUN_LINK}]({LOCAL_RUN_LINK})" in text
    line = next(line for line in summary_lines(summary) if line.startswith("MLflow"))
    assert line.endswith(
        "start the UI: mlflow ui --backend-store-uri sqlite:///x/mlflow.db · then open: "
        + LOCAL_RUN_LINK
    )
    summary.mlflow.ui_command = "http://mlflow.internal:5000"
    summary.mlflow.run_url = "http://mlflow.internal:5000/#/experiments/1/runs/p123?x=1"
    line = next(line for line in summary_lines(summary) if line.startswith("MLflow"))
    assert line.endswith("· open: http://mlflow.internal:5000/#/experiments/1/runs/p123?x=1")
    assert "Open the run in the MLflow UI: [http://mlflow.internal" in (
        markdown.summary_markdown(summary)
    )


def test_the_summary_names_a_clusters_ray_dashboard_not_a_stopped_local_one():
    from trainflow.render import summary_lines

    summary = synthetic_summary()  # a local instance: its dashboard stopped with the run
    assert not [line for line in summary_lines(summary) if line.startswith("Ray ")]
    summary.ray_dashboard = "http://head.internal:8265"
    assert "Ray     dashboard http://head.internal:8265" in summary_lines(summary)
    assert RunSummary.from_dict(summary.to_dict()).ray_dashboard == summary.ray_dashboard


# ---------------------------------------------------------------------------- the run summary

# The keys that `trainflow run --summary-json`, summary.json on MLflow, the benchmarks (B4) and
# the e2e tests read.
SUMMARY_KEYS = [
    "run_id",
    "data",
    "sweep",
    "test_metrics",
    "mlflow",
    "model",
    "checkpoint",
    "storage",
    "stage_seconds",
    "report",
    "ray_dashboard",
    "last_epoch",
    "outages",
]


def test_run_summary_to_dict_keeps_the_json_shape():
    doc = json.loads(json.dumps(synthetic_summary().to_dict()))
    assert list(doc) == SUMMARY_KEYS
    assert list(doc["data"]) == ["source", "fingerprint", "rows", "preprocess_cached"]
    assert list(doc["mlflow"]) == [
        "tracking_uri",
        "experiment",
        "experiment_id",
        "parent_run_id",
        "train_run_id",
        "ui_command",
        "run_url",
    ]
    # the registered version's dict followed by the gate's, as the promote stage returns them
    assert list(doc["model"]) == [
        "name",
        "version",
        "model_uri",
        "logged_model_uri",
        "source_run_id",
        "state_file",
        "decision",
        "champion_version",
        "challenger_version",
        "challenger_value",
        "champion_value",
        "aliases",
        "gate_record",
    ]
    assert doc["sweep"] == synthetic_sweep().to_dict()
    assert list(doc["sweep"]["trials"][0]) == [
        "trial_id",
        "params",
        "status",
        "epochs",
        "metrics",
        "error",
        "history",
    ]
    assert doc["stage_seconds"] == {"preprocess": 1.0, "sweep": 10.0}
    assert doc["report"] is None
    assert sum(doc["data"]["rows"].values()) == 1797
    assert doc["sweep"]["epochs_spent"] == 8
    assert doc["test_metrics"]["test_accuracy"] == 0.95


def test_run_summary_round_trip():
    summary = synthetic_summary()
    summary.report = "http://h/report.html"
    doc = json.loads(json.dumps(summary.to_dict()))
    again = RunSummary.from_dict(doc)
    assert again == summary
    assert isinstance(again.sweep.trials[0], TrialSummary)
    summary.sweep = None
    assert RunSummary.from_dict(summary.to_dict()) == summary


def test_trial_history_from_tunes_progress_frame():
    """The per-trial histories the sweep plots use (training.tune.outcome fills TrialSummary.history
    from Tune's ``result.metrics_dataframe``): one row per iteration, the last report wins."""
    import pandas as pd

    from training.tune.outcome import trial_history

    class FakeResult:
        metrics_dataframe = pd.DataFrame(
            {
                "training_iteration": [1, 2, 2, 3],
                "train_loss": [2.0, 1.5, 1.4, 1.0],
                "val_loss": [2.1, 1.6, 1.5, float("nan")],
                "val_accuracy": [0.3, 0.5, 0.55, 0.7],
                "pid": [1, 1, 1, 1],
            }
        )

    history = trial_history(FakeResult())
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert history[1] == {"epoch": 2, "train_loss": 1.4, "val_loss": 1.5, "val_accuracy": 0.55}
    assert "val_loss" not in history[2]  # NaN dropped
    FakeResult.metrics_dataframe = None
    assert trial_history(FakeResult()) == []


def test_trials_table_has_params_best_metric_epochs_and_fate():
    """The Prefect table artifact of the sweep's trials."""
    rows = markdown.trials_table(synthetic_sweep(), ASHA)
    assert [row["trial"] for row in rows] == ["trial 00 (best)", "trial 01", "trial 02", "trial 03"]
    first = rows[0]
    assert list(first) == [
        "trial",
        "train.lr",
        "train.batch_size",
        "best val_accuracy",
        "epochs",
        "fate",
    ]
    assert first["train.lr"] == "0.0031" and first["train.batch_size"] == "64"
    assert first["best val_accuracy"] == "0.9"  # the best epoch, not the last
    assert first["epochs"] == "4 of 4" and first["fate"] == "completed all 4 iterations"
    assert rows[1]["fate"].startswith("stopped by ASHA at rung 1")
    assert rows[3]["fate"].startswith("errored")


def test_best_value_follows_the_metric_direction():
    sweep = synthetic_sweep()
    trial = sweep.trials[0]
    assert markdown.best_value(trial, "val_accuracy") == max(
        row["val_accuracy"] for row in trial.history
    )
    assert markdown.best_value(trial, "val_loss") == min(row["val_loss"] for row in trial.history)


def test_parent_run_note_links_the_runs_and_the_version():
    links = {
        "best trial (trial 00 · lr=0.0031)": "http://m/#/experiments/1/runs/b?workflowType=x",
        "train run": "http://m/#/experiments/1/runs/t",
        "model digits version 3": "http://m/#/models/digits/versions/3",
    }
    note = markdown.parent_run_note(synthetic_summary(), links)
    assert note.startswith("**trainflow pipeline run `abc123`**")
    assert "the champion's params (this run's params) are the best trial's" in note
    for label, url in links.items():
        assert f"- [{label}]({url})" in note
    assert "gate **kept-champion**" in note


def test_the_summary_train_line_gives_the_last_epochs_throughput():
    from trainflow.render import summary_lines

    summary = synthetic_summary()
    assert not [line for line in summary_lines(summary) if line.startswith("train ")]
    summary.last_epoch = {"epoch": 20.0, "workers": 2.0, "train_rows_per_s": 5210.4}
    summary.last_epoch["data_wait_share"] = 0.07
    (line,) = [line for line in summary_lines(summary) if line.startswith("train ")]
    assert line.endswith("20 epochs on 2 worker(s) · last epoch 5,210 rows/s, 7% waiting on data")
    assert RunSummary.from_dict(summary.to_dict()).last_epoch == summary.last_epoch
