"""A folder of PNG files in class sub-folders, end to end: one `trainflow run`
with the CNN straight on the folder (no conversion step), then its champion scores PNG bytes
in-process and `trainflow predict` scores the folder. One pipeline run for the whole module: CI
time is short."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cli_runner import run_cli

from training.datasets.synthetic_images import write_digit_images

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "digit-files-smoke"
IMAGES = 400
SETS = {
    "data.image_shape": "[1,16,16]",
    "model.kind": "cnn",
    "sweep.enabled": "false",
    "train.max_epochs": 8,
    "train.num_workers": 1,
    "mlflow.experiment": "trainflow-smoke",
    "mlflow.registered_model": MODEL,
}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("image-folder-home")


@pytest.fixture(scope="module")
def folder(home) -> str:
    return write_digit_images(home / "digits", IMAGES)


@pytest.fixture(scope="module")
def run(home, folder):
    out = home / "summary.json"
    sets = [a for k, v in {"data.source": folder, **SETS}.items() for a in ("--set", f"{k}={v}")]
    proc = run_cli(home, "run", *sets, "--summary-json", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), proc


def test_the_cnn_trains_on_the_folder_as_it_is(run):
    summary, _ = run
    assert sum(summary["data"]["rows"].values()) == IMAGES
    # Ten classes: a random guess scores about 0.1.
    assert summary["test_metrics"]["test_accuracy"] > 0.5


def test_the_champion_predicts_from_png_bytes(home, folder, run):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    files = sorted(Path(folder).glob("*/*.png"))[::7]
    rows = pd.DataFrame({"image": [f.read_bytes() for f in files]})
    predicted = model.predict(rows)["prediction"].astype(str).tolist()
    truth = [f.parent.name for f in files]
    right = sum(p == t for p, t in zip(predicted, truth, strict=True))
    assert right / len(files) > 0.5, list(zip(predicted, truth, strict=True))


def test_predict_scores_a_folder_of_image_files(home, folder, run):
    out = home / "predictions.parquet"
    proc = run_cli(home, "predict", "-m", f"models:/{MODEL}@champion", "-i", folder, "-o", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert " ".join(proc.stdout.split()) == f"wrote {IMAGES} predictions to {out}"
    predicted = pd.read_parquet(out, columns=["path", "prediction"])
    truth = predicted["path"].map(lambda p: Path(p).parent.name)
    assert len(predicted) == IMAGES
    assert (predicted["prediction"].astype(str) == truth).mean() > 0.5
