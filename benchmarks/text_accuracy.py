"""B10, accuracy: trainflow's MLP on hashed n-grams beside the baseline a user would
reach for first, scikit-learn's TF-IDF (word 1-2 grams) + LogisticRegression, on the same split
of the bundled BBC News articles.

    .venv/bin/python -m benchmarks.text_accuracy

trainflow: ``trainflow run --config configs/news-hashed.yaml`` in a fresh home (sweep, final
training, test evaluation: its own test accuracy). The baseline: the same 2,225 articles split by
trainflow's own row hash (``training.data.rows.row_hashes`` with the text column's role, then
``assign_splits``); its split sizes are checked against the run's. TF-IDF and the regression are
fitted on the train split (scikit-learn's defaults otherwise; ``max_iter`` raised so it
converges) and scored on the test split. Goal: trainflow within 1 point of the baseline's test
accuracy (or better). Writes ``benchmarks/results/text-accuracy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks.common import REPO_ROOT

RESULT = REPO_ROOT / "benchmarks" / "results" / "text-accuracy.json"
CONFIG = REPO_ROOT / "configs" / "news-hashed.yaml"
LABEL = "category"


def trainflow_splits(frame, seed: int = 0) -> np.ndarray:
    """train/val/test per row, as trainflow assigns them (a free-text column hashes as text)."""
    from training.config import SplitConfig
    from training.data.rows import assign_splits, row_hashes

    roles = {c: "text" for c in frame.columns if c != LABEL}
    hashes = row_hashes(frame, label_column=LABEL, roles=roles, seed=seed)
    return assign_splits(hashes, SplitConfig(seed=seed))


def baseline(frame, splits: np.ndarray) -> dict:
    """TF-IDF (word 1-2 grams) + logistic regression: test accuracy and seconds to fit."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train, test = splits == "train", splits == "test"
    started = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, 2))
    x_train = vectorizer.fit_transform(frame["text"][train])
    model = LogisticRegression(max_iter=2000).fit(x_train, frame[LABEL][train])
    fit_s = time.perf_counter() - started
    predicted = model.predict(vectorizer.transform(frame["text"][test]))
    accuracy = float((predicted == frame[LABEL][test].to_numpy()).mean())
    return {"test_accuracy": accuracy, "fit_s": round(fit_s, 2), "features": x_train.shape[1]}


def trainflow_run(home: Path) -> dict:
    """``trainflow run`` on the news config in a fresh home: its summary and wall seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RAY_"))}
    env["TRAINFLOW_HOME"] = str(home / ".trainflow")
    summary = home / "summary.json"
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "trainflow", "run", "--config", str(CONFIG)]
    proc = subprocess.run(
        [*cmd, "--summary-json", str(summary)], cwd=home, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"trainflow run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_s": round(wall, 1), **json.loads(summary.read_text())}


def measure() -> dict:
    from benchmarks.result_files import machine_info
    from training.data.builtin import bbc_news_frame

    machine = machine_info()
    frame = bbc_news_frame()
    splits = trainflow_splits(frame)
    ours_sizes = {s: int((splits == s).sum()) for s in ("train", "val", "test")}
    with tempfile.TemporaryDirectory(prefix="trainflow-text-bench-") as tmp:
        run = trainflow_run(Path(tmp))
    if run["data"]["rows"] != ours_sizes:
        raise SystemExit(f"split differs: trainflow {run['data']['rows']} vs {ours_sizes}")
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "data": "builtin:bbc_news",
        "split_rows": ours_sizes,
        "trainflow": {
            "config": str(CONFIG.relative_to(REPO_ROOT)),
            "test_accuracy": run["test_metrics"]["test_accuracy"],
            "stage_seconds": run.get("stage_seconds"),
            "wall_s": run["wall_s"],
        },
        "tfidf_logreg": baseline(frame, splits),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    result = measure()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    ours, theirs = result["trainflow"], result["tfidf_logreg"]
    print(
        f"test accuracy: trainflow {ours['test_accuracy']:.4f} (wall {ours['wall_s']} s), "
        f"TF-IDF + logistic regression {theirs['test_accuracy']:.4f} (fit {theirs['fit_s']} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
