"""`trainflow inspect`: a table's columns, roles, gaps, task, classes and splits as a run would
take them, read here without Ray; a table a run would refuse is the run's one-line error, exit
2; nothing is written under the storage root. And the preprocess line naming each role's
columns."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from trainflow.cli import app
from trainflow.inspect_command import overview_lines
from training.config import PipelineConfig
from training.data.overview import overview, rebatched
from training.data.roles import role_line
from training.datasets.synthetic_mixed import write_mixed
from training.errors import DataValidationError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(source, **data) -> PipelineConfig:
    return PipelineConfig.model_validate({"data": {"source": str(source), **data}})


def _by_name(view) -> dict:
    return {c.name: c for c in view.columns}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mixed")
    write_mixed(folder, 3000, 0, num_files=2)
    return folder


def test_the_mixed_table_gets_every_role_and_its_gaps(mixed):
    view = overview(_config(mixed))
    columns = _by_name(view)
    roles = {name: c.role for name, c in columns.items()}
    assert roles == {
        "amount": "numeric",
        "tenure": "numeric",
        "score": "numeric",
        "plan": "categorical",
        "region": "categorical",
        "signup": "datetime",
        "customer_id": "ignored",
        "label": "label",
    }
    frame = pd.concat(pd.read_parquet(f) for f in sorted(mixed.glob("*.parquet")))
    assert {n: c.missing for n, c in columns.items()} == frame.isna().sum().to_dict()
    assert "train median" in columns["amount"].detail
    assert columns["plan"].detail == "5 values in train"
    assert "id-like" in columns["customer_id"].detail
    assert view.task == "classification" and "integer label 'label'" in view.task_reason
    assert sorted(c for c, _ in view.classes) == ["0", "1", "2", "3"]
    assert sum(n for _, n in view.classes) == sum(view.splits.values()) == view.rows == 3000
    assert 0.6 < view.splits["train"] / 3000 < 0.8


def test_the_console_lines_are_aligned(mixed):
    result = CliRunner().invoke(app, ["inspect", "--set", f"data.source={mixed}"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"data: {mixed} (2 parquet files, 3,000 rows)"
    rows = [line for line in lines if line.startswith("  ")]
    assert len(rows) == 1 + 8  # the header and one line per column
    role_at = {re.match(r"  \S+\s+", line).end() for line in rows}
    assert len(role_at) == 1, rows  # every role starts in the same place
    assert lines[-3].startswith("task: classification (auto: integer label 'label'")
    assert lines[-2].startswith("classes: ") and "%)" in lines[-2]
    assert lines[-1].startswith("splits: train ")


def _dated(tmp_path: Path) -> Path:
    days = pd.date_range("2021-01-01", periods=200, freq="D")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "price": rng.normal(10, 2, 200),
            "sold": days.strftime("%d/%m/%Y"),
            "listed": days.strftime("%m/%d/%Y").where(days.day <= 12, "01/02/2021"),
            "colour": rng.choice(["red", "green", None], 200),
            "y": rng.choice(["a", "b"], 200),
        }
    )
    path = tmp_path / "dated.csv"
    frame.to_csv(path, index=False)
    return path


def test_a_date_column_shows_its_format_and_day_order(tmp_path):
    view = overview(_config(_dated(tmp_path), label_column="y"))
    columns = _by_name(view)
    assert columns["sold"].role == "datetime"
    assert columns["sold"].detail == "text as DD/MM/YYYY, day first"
    assert columns["listed"].role == "datetime"
    assert columns["listed"].detail == "text as MM/DD/YYYY assumed: no day above 12"
    assert columns["colour"].role == "categorical" and columns["colour"].missing > 0
    assert columns["y"].detail == "2 classes"


def test_a_regression_label_is_described(tmp_path):
    path = tmp_path / "r.parquet"
    rng = np.random.default_rng(1)
    pq.write_table(pa.table({"x": rng.normal(size=100), "y": rng.normal(5, 2, 100)}), path)
    view = overview(_config(path, label_column="y"))
    assert view.task == "regression" and view.classes == []
    assert view.label_stats is not None and 4 < view.label_stats[0] < 6
    assert any(line.startswith("label: mean ") for line in overview_lines(view))


def test_a_table_a_run_refuses_is_the_same_error(tmp_path):
    path = tmp_path / "gaps.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0], "label": [0, None, 1]}), path)
    with pytest.raises(DataValidationError, match="1 of 3 rows have no value in label column"):
        overview(_config(path))


def test_a_missing_label_column_is_one_line_and_exit_2(tmp_path):
    source = _dated(tmp_path)
    env = {**os.environ, "TRAINFLOW_HOME": str(tmp_path / "home")}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow", "inspect", "--set", f"data.source={source}"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(f"trainflow inspect refused the table in {time.monotonic() - start:.1f} s")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "has no label column 'label'; its columns are" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_rows_without_a_label_are_counted_where_a_run_drops_them(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "x,label\n" + "".join(f"{i},{'ab'[i % 2] if i != 3 else ''}\n" for i in range(40))
    )
    view = overview(_config(path, missing_label="drop"))
    label = _by_name(view)["label"]
    assert label.missing == 1 and view.unlabeled_dropped == 1
    assert "1 without a label dropped" in label.detail
    assert view.rows == 40 and sum(view.splits.values()) == 39


_NO_SERVICES = """
import sys
from trainflow.cli import app
try:
    app(["inspect", "--set", "data.source=SOURCE"], prog_name="trainflow")
except SystemExit as exc:
    assert not exc.code, exc.code
print(sorted({m.split(".")[0] for m in sys.modules} & {"ray", "prefect", "mlflow", "torch"}))
"""


def test_inspect_starts_no_ray_prefect_or_mlflow(tmp_path, mixed):
    env = {**os.environ, "TRAINFLOW_HOME": str(tmp_path / "home")}
    code = _NO_SERVICES.replace("SOURCE", str(mixed))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "customer_id" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_inspect_writes_nothing_under_the_storage_root(tmp_path, monkeypatch, mixed):
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    overview(_config(mixed))
    overview(_config(mixed, **{"columns": {"region": "ignore"}}))
    assert not home.exists()
    storage = tmp_path / "storage"
    config = _config(mixed).with_overrides({"storage.root": str(storage)})
    overview(config)
    assert not storage.exists()


def test_the_summary_sees_the_batches_a_run_does():
    frames = [pd.DataFrame({"a": range(i * 7, i * 7 + 7)}) for i in range(5)]
    batches = list(rebatched(frames, 10))
    assert [len(b) for b in batches] == [10, 10, 10, 5]
    assert pd.concat(batches)["a"].tolist() == list(range(35))


def test_the_preprocess_line_names_each_roles_columns():
    pixels = {f"pixel_{i}": "numeric" for i in range(64)}
    assert role_line(pixels) == (
        "64 numeric (pixel_0, pixel_1, pixel_2, pixel_3, pixel_4, +59 more)"
    )
    roles = {"when": "datetime", "island": "categorical", "a": "numeric", "id": "id-like"}
    assert role_line(roles) == (
        "1 numeric (a), 1 categorical (island), 1 datetime (when), 1 id-like ignored (id)"
    )


def test_the_run_line_names_the_penguins_columns_as_the_e2e_test_expects():
    """tests/e2e/test_table_pipeline.py asserts on this text of a real run's console."""
    from training.stages.preprocess import _columns_text

    names = ["island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
    roles = {n: "numeric" for n in names} | {"sex": "categorical", "year": "numeric"}
    roles["island"] = "categorical"
    spec = SimpleNamespace(column_roles=roles, datetime_found={}, text_found={}, tokens=None)
    manifest = SimpleNamespace(spec=spec, ignored_columns={})
    assert _columns_text(manifest) == (
        "; columns: 5 numeric (bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g, "
        "year), 2 categorical (island, sex)"
    )
