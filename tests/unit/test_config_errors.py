"""Bad configuration the cluster or the CLI must refuse: workers or GPUs a
cluster cannot host, credentials in the storage endpoint, and the CLI refusing a bad config with
the key and what is allowed, before anything starts. Schema rules: tests/unit/test_config.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.config.overrides import load_config
from training.errors import ConfigError
from training.platform.cluster import check_can_host

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_gpu_workers_on_a_cluster_without_gpus():
    with pytest.raises(ConfigError) as err:
        check_can_host({"CPU": 16.0}, 2, {"CPU": 1.0, "GPU": 1.0})
    message = str(err.value)
    assert "train.num_workers=2" in message and "needs 2 GPU" in message
    assert "has 0" in message and "train.resources_per_worker" in message


def test_workers_an_existing_cluster_can_never_host():
    # ray.address set: the config cannot know the cluster; the stage checks before training.
    config = load_config(None, ["train.num_workers=8", "ray.address=10.0.0.1:6379"])
    with pytest.raises(ConfigError) as err:
        check_can_host({"CPU": 4.0}, config.train.min_workers, config.train.resources_per_worker)
    assert "needs 8 CPU but the Ray cluster has 4" in str(err.value)
    assert "lower train.num_workers" in str(err.value)


def test_custom_resource_the_cluster_lacks():
    with pytest.raises(ConfigError) as err:
        check_can_host({"CPU": 4.0}, 1, {"CPU": 1.0, "accelerator_x": 1.0})
    assert "accelerator_x" in str(err.value)


def test_fitting_workers_pass():
    check_can_host({"CPU": 4.0, "GPU": 2.0}, 2, {"CPU": 1.0, "GPU": 1.0})


def test_credentials_in_the_storage_endpoint_are_refused_and_not_echoed():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["storage.endpoint_url=http://AKIAX:sup3rsecret@127.0.0.1:9000"])
    message = str(err.value)
    assert "storage.endpoint_url" in message and "AWS_SECRET_ACCESS_KEY" in message
    assert "sup3rsecret" not in message and "AKIAX" not in message
    assert load_config(None, ["storage.endpoint_url=http://127.0.0.1:9000"]).storage.endpoint_url


def test_cli_refuses_bad_config_before_anything_starts(tmp_path):
    home = tmp_path / "home"  # must not even be created
    env = {**os.environ, "TRAINFLOW_HOME": str(home)}
    env.pop("PREFECT_HOME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow", "run", "--set", "train.batch_size=0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "train.batch_size" in proc.stderr and "greater than or equal to 1" in proc.stderr
    # No home, no Prefect/MLflow state, nothing in the working directory.
    assert list(tmp_path.iterdir()) == [], sorted(str(p) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["train.eval_every_steps=0"], "train.eval_every_steps"),
        (["train.profile={steps: 0}"], "train.profile.steps"),
        (["train.profile={step: 3}"], "train.profile.step"),  # a typo of steps
        (["train.compile=maybe"], "train.compile"),
        (
            ["train.engine=hf_trainer", "train.eval_every_steps=10", "train.compile=true"],
            "train.eval_every_steps, train.compile: trainflow's loop only",
        ),
    ],
)
def test_bad_step_level_training_keys_are_refused(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert expected in str(err.value)


def test_cli_refuses_a_profile_of_no_steps_with_exit_2(tmp_path):
    env = {**os.environ, "TRAINFLOW_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_HOME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow", "run", "--set", "train.profile={steps: 0}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "train.profile.steps" in proc.stderr and "Traceback" not in proc.stderr
