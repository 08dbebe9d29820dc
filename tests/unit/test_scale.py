"""The loop's scale-out math (no Ray): a constant global batch across worker counts, gradient
accumulation equal to one big batch, bf16 autocast, and the config -> Ray mapping."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from training.config import RayConfig
from training.config.overrides import load_config
from training.loop.loop import accumulate_gradients, step_plan
from training.platform.cluster import job_runtime_env, worker_resources


@pytest.mark.parametrize("global_batch", [64, 96, 128])
@pytest.mark.parametrize("max_workers", [2, 4])
def test_global_batch_is_constant_as_workers_come_and_go(global_batch, max_workers):
    micro_at_full_size = step_plan(global_batch, max_workers, max_workers)[1]
    for world in range(1, max_workers + 1):
        per_worker, micro = step_plan(global_batch, world, max_workers)
        # The optimizer steps on the global batch: exactly when the workers divide it, else on
        # the largest multiple of the worker count below it (ranks must hold equal rows).
        assert global_batch - world < per_worker * world <= global_batch
        if global_batch % world == 0:
            assert per_worker * world == global_batch
        assert micro <= micro_at_full_size  # fewer workers accumulate; memory does not grow
    # A worker alone on a 2-worker job: two micro-batches of half the global batch.
    assert step_plan(64, 1, 2) == (64, 32)
    assert step_plan(64, 2, 2) == (32, 32)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def test_accumulated_gradient_equals_one_pass_over_the_global_batch():
    features, labels = torch.randn(64, 8), torch.randint(0, 3, (64,))
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    whole = _model()
    loss_whole = accumulate_gradients(whole, loss_fn, features, labels, micro=64)
    # One worker, micro-batches of 32 and of 5 (uneven tail): the same gradient and loss.
    for micro in (32, 5):
        split = copy.deepcopy(whole)
        split.zero_grad(set_to_none=True)
        loss_split = accumulate_gradients(split, loss_fn, features, labels, micro=micro)
        assert loss_split == pytest.approx(loss_whole, rel=1e-5)
        for a, b in zip(_grads(whole), _grads(split), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # Two workers of 32 rows each, averaged as DDP does: the same gradient again.
    halves = []
    for part in (slice(0, 32), slice(32, 64)):
        worker = copy.deepcopy(whole)
        worker.zero_grad(set_to_none=True)
        accumulate_gradients(worker, loss_fn, features[part], labels[part], micro=32)
        halves.append(_grads(worker))
    for a, (b, c) in zip(_grads(whole), zip(*halves, strict=True), strict=True):
        torch.testing.assert_close(a, (b + c) / 2, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_runs_the_forward_pass_in_bfloat16():
    model = _model()
    seen = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    features, labels = torch.randn(16, 8), torch.randint(0, 3, (16,))
    loss = accumulate_gradients(
        model, nn.CrossEntropyLoss(reduction="sum"), features, labels, micro=8, bf16=True
    )
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert torch.isfinite(torch.tensor(loss))
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_gpu_config_means_nccl_and_one_gpu_per_worker():
    config = load_config(None, ["train.use_gpu=true", "train.precision=bf16"])
    assert config.train.torch_backend == "nccl"
    assert worker_resources(config.train) == {"CPU": 1.0, "GPU": 1.0}
    cpu = load_config(None, [])
    assert cpu.train.torch_backend == "gloo"
    assert worker_resources(cpu.train) == {"CPU": 1.0}


def test_elastic_workers_are_a_min_max_pair():
    config = load_config(None, ["train.num_workers=[1, 2]", "train.elastic_resize_interval_s=5"])
    assert (config.train.min_workers, config.train.max_workers) == (1, 2)


def test_ship_code_uploads_training_and_pins_the_cluster_address():
    shipped = job_runtime_env(RayConfig(ship_code=True), "10.0.0.1:6379")
    (module,) = shipped["py_modules"]
    assert module.endswith("training")
    # Train's State API client must ask this cluster, not whichever started last on the node.
    assert shipped["env_vars"]["RAY_ADDRESS"] == "10.0.0.1:6379"
    installed = job_runtime_env(RayConfig(), None)
    assert "py_modules" not in installed and "RAY_ADDRESS" not in installed["env_vars"]
    # Credentials never travel in the runtime_env (it is visible in the dashboard).
    assert not any(k.startswith("AWS_") for k in shipped["env_vars"])


def test_ray_paths_inside_s3_become_uris_again():
    from training.storage import StorageLayout

    s3 = StorageLayout(root="s3://bucket/prefix", endpoint_url="http://127.0.0.1:9000")
    path, fs = s3.ray_storage("run1")
    assert path == "bucket/prefix/runs/run1" and fs is not None
    assert (
        s3.uri_of(f"{path}/train/checkpoint_1") == "s3://bucket/prefix/runs/run1/train/checkpoint_1"
    )
    local = StorageLayout(root="/data/tf")
    assert local.uri_of("/data/tf/runs/run1/train") == "/data/tf/runs/run1/train"


def test_embedded_mlflow_puts_artifacts_under_an_s3_root(tmp_path):
    from training.tracking.store import artifact_location

    sqlite = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert artifact_location(sqlite, "exp", "s3://bucket/prefix/") == (
        "s3://bucket/prefix/mlartifacts/exp"
    )
    assert artifact_location(sqlite, "exp", None).startswith("file://")
    # A tracking server decides its own artifact store (--artifacts-destination).
    assert artifact_location("http://127.0.0.1:5000", "exp", "s3://bucket/prefix") is None
