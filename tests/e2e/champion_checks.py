"""Helpers of the champion's e2e checks: its raw test rows, a Python without trainflow, and a
real ``mlflow models serve`` process on loopback."""

from __future__ import annotations

import json
import os
import signal
import site
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

NO_TRAINFLOW = """
import importlib.util, json, sys
sys.path[:0] = json.loads(sys.argv[1])  # the real site-packages only: no .pth, no editable finder
for name in ("training", "trainflow", "tasks", "flows"):
    assert importlib.util.find_spec(name) is None, f"{name} is importable"
import mlflow.pyfunc, pandas as pd
mlflow.set_tracking_uri(sys.argv[2])
model = mlflow.pyfunc.load_model(sys.argv[3])
out = model.predict(pd.read_parquet(sys.argv[4]))
out.to_parquet(sys.argv[5])
assert not [m for m in sys.modules if m.split(".")[0] in ("training", "trainflow")]
print(json.dumps({"rows": len(out), "columns": list(out.columns)}))
"""


# A Python that has neither trainflow nor the user's package: it loads the champion and scores.
WITHOUT_USER_CODE = """
import importlib.util, json, sys
sys.path[:0] = json.loads(sys.argv[1])  # the venv's site-packages only
for name in ("training", "trainflow", PACKAGE):
    assert importlib.util.find_spec(name) is None, f"{name} is importable"
import mlflow.pyfunc, pandas as pd
mlflow.set_tracking_uri(sys.argv[2])
model = mlflow.pyfunc.load_model(sys.argv[3])
out = model.predict(pd.read_parquet(sys.argv[4]))
out.to_parquet(sys.argv[5])
user = sys.modules.get(PACKAGE)
print(json.dumps({"rows": len(out), "user_code": getattr(user, "__file__", None)}))
"""


def load_without_user_code(
    package: str, tracking_uri: str, model_uri: str, table: Path, out: Path
) -> dict:
    """``load_model(model_uri).predict(table)`` in ``python -S`` where neither trainflow nor the
    user's ``package`` is importable; ``user_code``: where the model imported the package from
    (its own code directory)."""
    script = f"PACKAGE = {package!r}\n{WITHOUT_USER_CODE}"
    return run_alone(script, tracking_uri, model_uri, table, out)


def raw_test_rows(digits: Path, split_seed: int = 0) -> pd.DataFrame:
    """The raw rows preprocessing put in the test split (same seeded row hash)."""
    from training.config import SplitConfig
    from training.data.rows import assign_splits, row_hashes

    frame = pq.read_table(digits).to_pandas()
    features = [c for c in frame.columns if c != "label"]
    cfg = SplitConfig(seed=split_seed)
    hashes = row_hashes(frame, label_column="label", feature_columns=features, seed=cfg.seed)
    return frame[assign_splits(hashes, cfg) == "test"].reset_index(drop=True)


def champion_scores_digits_alone(home: Path, client, package: str, model: str) -> dict:
    """The champion of ``model`` (a custom network from the user's ``package``), loaded where
    neither trainflow nor the package is importable, scores the raw digits test rows of the
    run in ``home``: every row answered, the package imported from the model's own code
    directory, and the same test accuracy the version carries."""
    rows = raw_test_rows(home / "datasets" / "digits" / "digits.parquet")
    where = home / "alone"
    where.mkdir()
    rows.drop(columns=["label"]).to_parquet(where / "test.parquet")
    version = client.get_model_version_by_alias(model, "champion")
    out = load_without_user_code(
        package,
        f"sqlite:///{home / 'mlflow.db'}",
        f"models:/{model}@champion",
        where / "test.parquet",
        where / "preds.parquet",
    )
    assert out["rows"] == len(rows)
    assert out["user_code"] and f"code/{package}/__init__.py" in out["user_code"], out
    preds = pd.read_parquet(where / "preds.parquet")
    accuracy = float((preds["prediction"].to_numpy() == rows["label"].to_numpy()).mean())
    assert accuracy == pytest.approx(float(version.tags["test_accuracy"]), abs=1e-6)
    return out


def predict_without_trainflow(tracking_uri: str, model_uri: str, table: Path, out: Path) -> dict:
    """``mlflow.pyfunc.load_model(model_uri).predict(table)`` in ``python -S`` with only the
    venv's site-packages on its path, from a directory outside the repository."""
    return run_alone(NO_TRAINFLOW, tracking_uri, model_uri, table, out)


def run_alone(script: str, tracking_uri: str, model_uri: str, table: Path, out: Path) -> dict:
    """``script`` in ``python -S`` with only the venv's site-packages on its path, run from
    ``out``'s directory with argv [site dirs, tracking URI, model URI, table, out]; its last
    stdout line, as JSON."""
    site_dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script, json.dumps(site_dirs), tracking_uri]
        + [model_uri, str(table), str(out)],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Served:
    """``mlflow models serve -m MODEL --env-manager local`` on 127.0.0.1, in its own session."""

    def __init__(self, tracking_uri: str, model_uri: str, port: int, log: Path):
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri}
        # MLflow starts `uvicorn` by name: the venv's bin directory must be on PATH.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri]
            + ["--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)]
            + ["--workers", "1"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"mlflow models serve exited {self.proc.returncode}"
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        raise AssertionError(f"mlflow models serve not ready after {timeout_s} s")

    def invoke(self, payload: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.url}/invocations",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()


def check_lineage(tracking_uri: str, version, accuracy: float) -> None:
    """The evaluate run behind a version: MLflow's evaluator beside ours, its dataset inputs
    (digest = the data fingerprint), and the train run's inputs."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    evaluate_run = client.search_runs(
        [client.get_run(version.run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{version.tags['pipeline_run']}' "
        "and tags.trainflow.stage = 'evaluate'",
    )[0]
    metrics = evaluate_run.data.metrics
    assert abs(metrics["test_accuracy"] - accuracy) < 1e-6
    # MLflow's evaluator, without a second copy of ours
    assert "f1_score" in metrics and "accuracy_score" not in metrics, sorted(metrics)
    artifacts = {a.path for a in client.list_artifacts(evaluate_run.info.run_id)}
    assert "confusion_matrix.png" not in artifacts, artifacts  # ours: plots/confusion_matrix.png
    assert {"roc_curve_plot.png", "precision_recall_curve_plot.png"} <= artifacts, artifacts
    assert "per_class_metrics.csv" in artifacts, artifacts
    by_context = {
        t.value: d.dataset
        for d in evaluate_run.inputs.dataset_inputs
        for t in d.tags
        if t.key == "mlflow.data.context"
    }
    assert by_context["test"].digest == version.tags["data_fingerprint"], by_context
    train_inputs = client.get_run(version.run_id).inputs.dataset_inputs
    contexts = sorted(t.value for d in train_inputs for t in d.tags if t.key.endswith("context"))
    assert contexts == ["train", "val"]
