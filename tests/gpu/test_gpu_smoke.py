"""The GPU path: the smoke pipeline with `train.use_gpu: true` (one GPU per worker, nccl, bf16
autocast, pinned-memory batches), plus a loop throughput probe on one GPU.

Runs only where CUDA is available; standalone:

    .venv/bin/pytest -m gpu tests/gpu -s

Prints and writes what it measured to $TRAINFLOW_GPU_RESULT (default: gpu-result.json in the
test's home): wall seconds, train-stage seconds, training throughput, GPU name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.e2e,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _record(home: Path, key: str, values: dict) -> None:
    path = Path(os.environ.get("TRAINFLOW_GPU_RESULT") or home / "gpu-result.json")
    result = json.loads(path.read_text()) if path.exists() else {}
    result[key] = values
    path.write_text(json.dumps(result, indent=2))
    print(f"{key}: {json.dumps(values)} -> {path}")


def test_loop_throughput_on_one_gpu_with_bf16(tmp_path):
    """The loop's step (accumulation + bf16 autocast) on the GPU: it learns, and how fast."""
    from torch import nn

    from training.loop.loop import accumulate_gradients

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    # A learnable synthetic task; batches come from pinned host memory as in training.
    weights = torch.randn(784, 10)
    features = torch.randn(64 * 1024, 784).pin_memory()
    labels = (features @ weights).argmax(dim=1).pin_memory()
    losses, rows = [], 0
    steps, batch = 200, 1024
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(steps):
        index = slice((step * batch) % len(labels), (step * batch) % len(labels) + batch)
        x = features[index].to(device, non_blocking=True)
        y = labels[index].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        losses.append(accumulate_gradients(model, loss_fn, x, y, micro=512, bf16=True) / batch)
        optimizer.step()
        rows += batch
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    assert losses[-1] < losses[0] * 0.7, (losses[0], losses[-1])
    _record(
        tmp_path,
        "loop_bf16",
        {
            "gpu": torch.cuda.get_device_name(0),
            "rows_per_s": round(rows / wall),
            "steps": steps,
            "batch": batch,
            "wall_s": round(wall, 2),
            "first_loss": round(losses[0], 4),
            "last_loss": round(losses[-1], 4),
        },
    )


def test_pipeline_trains_on_gpus(tmp_path):
    """`trainflow run` with use_gpu + bf16: one GPU per worker, nccl; the model is registered."""
    gpus = torch.cuda.device_count()
    summary_path = tmp_path / "summary.json"
    env = {**os.environ, "TRAINFLOW_HOME": str(tmp_path)}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PREFECT_HOME"):
        env.pop(key, None)
    command = [
        sys.executable,
        "-m",
        "trainflow",
        "run",
        "--config",
        SMOKE,
        "--run-id",
        "gpu",
        "--summary-json",
        str(summary_path),
        "--set",
        "train.use_gpu=true",
        "--set",
        "train.precision=bf16",
        "--set",
        f"train.num_workers={min(gpus, 2)}",
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    params = client.get_run(summary["mlflow"]["train_run_id"]).data.params
    assert params["train.use_gpu"] == "True" and params["train.precision"] == "bf16"
    assert summary["test_metrics"]["test_accuracy"] > 0.8
    train_rows = summary["data"]["rows"]["train"]
    epochs = int(params["train.max_epochs"])
    train_s = summary["stage_seconds"]["train"]
    _record(
        tmp_path,
        "pipeline_gpu",
        {
            "gpu": torch.cuda.get_device_name(0),
            "workers": min(gpus, 2),
            "wall_s": round(wall, 1),
            "stage_seconds": summary["stage_seconds"],
            "train_rows_per_s": round(train_rows * epochs / train_s),
            "test_accuracy": summary["test_metrics"]["test_accuracy"],
        },
    )
