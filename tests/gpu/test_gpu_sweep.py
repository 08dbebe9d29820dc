"""A tiny sweep with `train.use_gpu`: every trial trains on its GPU share, in bf16.

Runs only where CUDA is available; standalone:

    .venv/bin/pytest -m gpu tests/gpu/test_gpu_sweep.py -s
"""

from __future__ import annotations

import glob
import os

import pytest
import torch

from training.config.overrides import load_config
from training.storage import StorageLayout
from training.tune.sweep import run_sweep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TINY = [
    "train.use_gpu=true",
    "train.precision=bf16",
    "train.num_workers=1",
    "sweep.num_samples=2",
    "sweep.max_concurrent_trials=2",
    "sweep.asha.max_t=2",
    "sweep.asha.grace_period=2",
    "sweep.search_space={train.lr: {loguniform: [1.0e-3, 1.0e-2]}}",
]


def _checkpoint_devices(layout: StorageLayout, run_id: str) -> set[str]:
    """Where each trial's weights lived when it saved them (loaded without moving them)."""
    devices = set()
    pattern = os.path.join(layout.runs_dir(run_id), "**", "state.pt")
    for path in glob.glob(pattern, recursive=True):
        state = torch.load(path, weights_only=True)
        devices.update(tensor.device.type for tensor in state["model"].values())
    return devices


def test_function_trials_share_one_gpu_in_bf16(manifest, layout):
    # Half a GPU each: both trials run at once on one GPU.
    config = load_config(None, [*TINY, "sweep.searcher=optuna", "sweep.gpus_per_trial=0.5"])
    outcome = run_sweep(config, manifest, "gpu-sweep", layout)
    assert [t.status for t in outcome.trials] == ["completed", "completed"]
    assert all(t.metrics["val_accuracy"] > 0.5 for t in outcome.trials)
    assert _checkpoint_devices(layout, "gpu-sweep") == {"cuda"}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two DDP ranks need two GPUs (nccl)")
def test_trainer_trials_give_each_worker_a_gpu(manifest, layout):
    config = load_config(
        None, [*TINY, "sweep.workers_per_trial=2", "sweep.max_concurrent_trials=1"]
    )
    outcome = run_sweep(config, manifest, "gpu-sweep-ddp", layout)
    assert [t.epochs for t in outcome.trials] == [2, 2]
    assert _checkpoint_devices(layout, "gpu-sweep-ddp") == {"cuda"}
