"""training.report: real PNG files, the series each plot shows, trial names and fates, and the
self-contained HTML report, all on synthetic run data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training import report
from training.report import confusion_matrix_png, learning_curves_png

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


ASHA = {"max_t": 4, "grace_period": 1, "reduction_factor": 2}


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


def synthetic_sweep() -> dict:
    """A SweepOutcome.to_dict() of 4 trials over two params: one completed (the best), two
    stopped by ASHA at rungs 1 and 2, one errored."""
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
            {
                "trial_id": trial_id,
                "params": {"train.lr": lr, "train.batch_size": bs},
                "status": status,
                "epochs": epochs,
                "metrics": {k: v for k, v in history[-1].items() if k != "epoch"},
                "error": error,
                "history": history,
            }
        )
    return {
        "best_trial_id": "abc12_00000",
        "best_params": {"train.lr": 0.0031, "train.batch_size": 64},
        "best_metric": rows[0]["metrics"]["val_accuracy"],
        "metric": "val_accuracy",
        "trials": rows,
        "epochs_spent": 8,
        "epochs_budget": 16,
    }


def legend_lines(ax) -> list:
    """The plotted series of an axes (helper lines such as rung markers are labelled "_...")."""
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_trial_run_name_has_number_and_params():
    name = report.trial_run_name("f3f1c_00003", {"train.lr": 0.0031234, "train.batch_size": 64})
    assert name == "trial 03 · lr=0.0031 bs=64"
    assert report.trial_run_name("x_00012", {}, width=3) == "trial 012"
    assert report.trial_run_name("weird", {"model.hidden_sizes": [128, 64]}) == (
        "trial weird · hidden=128x64"
    )
    assert len(report.trial_run_name("t_00001", {"k": "v" * 400})) == report.MAX_RUN_NAME


def test_asha_milestones_mirror_ray():
    assert report.asha_milestones(3, 1, 2) == [1, 2]
    assert report.asha_milestones(10, 1, 3) == [1, 3, 9]
    assert report.asha_milestones(10, 2, 2) == [2, 4, 8]
    assert report.asha_milestones(4, 4, 2) == [4]


def test_fate_detail_names_the_rung():
    milestones = report.asha_milestones(4, 1, 2)  # [1, 2, 4]
    assert report.fate_detail("stopped-early", 2, 4, milestones) == (
        "stopped by ASHA at rung 2 (iteration 2 of 4)"
    )
    assert report.fate_detail("stopped-early", 3, 4, milestones) == (
        "stopped early at iteration 3 of 4"
    )
    assert report.fate_detail("completed", 4, 4, milestones) == "completed all 4 iterations"
    assert report.fate_detail("errored", 1, 4, milestones, "boom") == "errored at iteration 1: boom"


def test_trial_rows_and_saving():
    rows = report.trial_rows(synthetic_sweep(), ASHA)
    assert [r["name"] for r in rows] == [
        "trial 00 · lr=0.0031 bs=64",
        "trial 01 · lr=0.0002 bs=32",
        "trial 02 · lr=0.0009 bs=128",
        "trial 03 · lr=0.02 bs=64",
    ]
    assert [r["rung"] for r in rows] == [None, 1, 2, None]
    assert [r["best"] for r in rows] == [True, False, False, False]
    assert rows[1]["fate"] == "stopped by ASHA at rung 1 (iteration 1 of 4)"
    assert report.sweep_saving(synthetic_sweep()) == pytest.approx(0.5)
    assert report.sweep_saving({"epochs_budget": 0}) is None


# ------------------------------------------------------------------------------------ sweep plots


def test_sweep_curves_one_series_per_trial_and_stopped_ones_cut_short():
    rows = report.trial_rows(synthetic_sweep(), ASHA)
    fig = report.sweep_curves_figure(rows, 4, report.asha_milestones(4, 1, 2))
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
        report._pyplot().close(fig)


def test_asha_rungs_bars_count_trials_alive():
    rows = report.trial_rows(synthetic_sweep(), ASHA)
    fig = report.asha_rungs_figure(rows, 4, [1, 2, 4], 8, 16)
    try:
        ax = fig.get_axes()[0]
        assert [p.get_height() for p in ax.patches] == [4, 2, 1, 1]
        assert "50% saved" in ax.get_title()
        texts = [t.get_text() for t in ax.texts]
        assert "rung 1\n1 stopped" in texts and "rung 2\n1 stopped" in texts
    finally:
        report._pyplot().close(fig)


def test_param_metric_scatter_one_series_per_fate():
    rows = report.trial_rows(synthetic_sweep(), ASHA)
    fig = report.param_metric_figure(rows, "train.lr")
    try:
        ax = fig.get_axes()[0]
        labels = ax.get_legend_handles_labels()[1]
        assert labels == ["completed", "stopped-early", "errored", "best"]
        assert ax.get_xscale() == "log"  # 0.0002 .. 0.02 spans 100x
        sizes = [len(c.get_offsets()) for c in ax.collections]
        assert sizes == [1, 2, 1, 1]
    finally:
        report._pyplot().close(fig)
    fig = report.param_metric_figure(rows, "train.batch_size")
    try:
        assert fig.get_axes()[0].get_xscale() == "linear"
    finally:
        report._pyplot().close(fig)


def test_per_class_bars():
    per_class = [
        {"class": str(i), "precision": 0.9, "recall": 0.8 + i / 100, "f1": 0.85, "support": 5}
        for i in range(10)
    ]
    fig = report.per_class_figure(per_class)
    try:
        ax = fig.get_axes()[0]
        assert [c.get_label() for c in ax.containers] == ["precision", "recall"]
        assert all(len(c) == 10 for c in ax.containers)
    finally:
        report._pyplot().close(fig)


def test_sweep_plots_write_every_png(tmp_path):
    plots = report.sweep_plots(synthetic_sweep(), ASHA, str(tmp_path))
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
    for trial in sweep["trials"]:
        trial["history"] = []
    for path in report.sweep_plots(sweep, ASHA, str(tmp_path)).values():
        assert_png(path, min_bytes=100)


def test_evaluation_plots(tmp_path):
    per_class = [
        {"class": c, "precision": 0.5, "recall": 0.7, "f1": 0.6, "support": 3} for c in "ab"
    ]
    plots = report.evaluation_plots(per_class, [[3, 0], [1, 2]], ["a", "b"], str(tmp_path))
    assert set(plots) == {"confusion_matrix.png", "per_class.png"}
    for path in plots.values():
        assert_png(path)


# -------------------------------------------------------------------------------- the HTML report


def synthetic_summary() -> dict:
    return {
        "run_id": "abc123",
        "data": {
            "source": "builtin:digits",
            "fingerprint": "f00d",
            "rows": {"train": 1200, "val": 300, "test": 297},
            "preprocess_cached": False,
        },
        "sweep": synthetic_sweep(),
        "test_metrics": {"test_accuracy": 0.95, "test_macro_f1": 0.94, "test_loss": 0.2},
        "mlflow": {
            "tracking_uri": "sqlite:///x/mlflow.db",
            "experiment": "exp <1>",
            "experiment_id": "1",
            "parent_run_id": "p123",
            "train_run_id": "t123",
            "ui_command": "mlflow ui --backend-store-uri sqlite:///x/mlflow.db",
        },
        "model": {
            "name": "digits",
            "version": "3",
            "decision": "kept-champion",
            "champion_version": "2",
            "challenger_value": 0.95,
            "champion_value": 0.96,
            "aliases": ["challenger"],
        },
        "checkpoint": "/x/checkpoint",
        "storage": "/x/runs/abc123",
        "stage_seconds": {"preprocess": 1.0, "sweep": 10.0},
    }


def test_pipeline_report_html_has_every_section_and_embedded_images(tmp_path):
    summary = synthetic_summary()
    per_class = [
        {"class": c, "precision": 0.5, "recall": 0.7, "f1": 0.6, "support": 3} for c in "ab"
    ]
    plots = report.pipeline_plots(
        str(tmp_path),
        sweep=summary["sweep"],
        asha=ASHA,
        train_history=_history(3, 0.5),
        per_class=per_class,
        confusion=[[3, 0], [1, 2]],
        class_names=["a", "b"],
    )
    assert len(plots) == 7  # curves, rungs, 2 params, train curves, confusion, per-class
    config = {"sweep": {"asha": ASHA}, "mlflow": {"gate": {"metric": "test_accuracy"}}}
    page = report.pipeline_report_html(
        summary,
        config,
        plots,
        config_text="train:\n  lr: 0.01\n",
        per_class=per_class,
        links={"parent run": "http://127.0.0.1:5000/#/experiments/1/runs/p123"},
    )
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for section in report.REPORT_SECTIONS:
        assert f'<section id="{section}">' in page, section
    assert page.count('src="data:image/png;base64,') == len(plots)
    # every trial with its readable name and fate; the best one highlighted
    assert '<tr class="best"><td>trial 00 · lr=0.0031 bs=64</td>' in page
    assert "stopped by ASHA at rung 2 (iteration 2 of 4)" in page
    assert "errored at iteration 1: RuntimeError: boom" in page
    assert "8 / 16 (50% saved by ASHA)" in page
    assert "gate decision: kept-champion" in page
    assert "exp &lt;1&gt;" in page  # escaped
    assert "lr: 0.01" in page and "builtin:digits" in page and "test_macro_f1" in page
    for title in plots:
        assert f'alt="{title}"' in page


def test_pipeline_report_html_without_sweep():
    summary = synthetic_summary()
    summary["sweep"] = None
    page = report.pipeline_report_html(summary, {}, {})
    assert "No sweep" in page
    assert '<section id="plots">' in page and "data:image/png" not in page


def test_report_markdown_points_at_the_report():
    text = report.report_markdown(
        synthetic_summary(), "http://h/#/experiments/1/runs/p/artifactPath/report.html"
    )
    assert "artifactPath/report.html" in text
    assert "kept-champion" in text and "50% saved" in text


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
