"""DeepSpeed on GPUs, as a user runs it: `trainflow run --config configs/lm.yaml` with
`train.strategy: deepspeed` (ZeRO-3), `use_gpu`, bf16: the run's preflight lets it through, the
final training runs under DeepSpeed's engine, and the language model is evaluated and
registered. The same path on CPU workers: tests/integration/test_deepspeed.py.

Runs only where CUDA and the `[deepspeed]` extra are; standalone:

    .venv/bin/pytest -m gpu tests/gpu/test_gpu_deepspeed.py -s
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
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
LM = str(REPO_ROOT / "configs" / "lm.yaml")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.e2e,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_language_model_trains_under_deepspeed_zero3_on_gpus(tmp_path):
    pytest.importorskip("deepspeed", reason="the [deepspeed] extra")
    gpus = torch.cuda.device_count()
    summary_path = tmp_path / "summary.json"
    env = {**os.environ, "TRAINFLOW_HOME": str(tmp_path)}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME"):
        env.pop(key, None)
    sets = {
        "train.use_gpu": "true",
        "train.precision": "bf16",
        "train.strategy": "deepspeed",
        "train.deepspeed.stage": "3",
        "train.num_workers": str(min(gpus, 2)),
        "sweep.gpus_per_trial": "0.5",  # two trials share a GPU
    }
    command = [sys.executable, "-m", "trainflow", "run", "--config", LM, "--run-id", "ds"]
    command += ["--summary-json", str(summary_path)]
    for key, value in sets.items():
        command += ["--set", f"{key}={value}"]
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    params = client.get_run(summary["mlflow"]["train_run_id"]).data.params
    assert params["train.strategy"] == "deepspeed" and params["train.deepspeed.stage"] == "3"
    perplexity = summary["test_metrics"]["test_perplexity"]
    assert math.isfinite(perplexity) and perplexity < 2000  # below the vocabulary's guess
    print(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(0),
                "workers": min(gpus, 2),
                "wall_s": round(wall, 1),
                "stage_seconds": summary["stage_seconds"],
                "test_perplexity": perplexity,
            }
        )
    )
