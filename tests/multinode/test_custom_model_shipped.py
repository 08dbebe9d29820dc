"""A custom model's package from the user's project directory reaches Ray workers on both nodes
of the two-node cluster through runtime_env ``py_modules``, not through a shared
path: each node's worker imports it from Ray's unpacked copy and builds the network from the
config, as the loop does. (Both nodes share this machine's disk, so the project directory is
deleted once uploaded: a worker could otherwise import it through the driver's sys.path.)
Cheap: no pipeline, one task per node on the session's cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SLOT = "trainslot"
pytestmark = [pytest.mark.e2e]

DRIVER = """
import json, sys
import ray
from training.platform.cluster import connect
from training.config import RayConfig, validate_config
from training.model.factory import ship_paths

address = sys.argv[1]
model = validate_config({"model": {"kind": "custom", "factory": "tf_mn_models.nets:build",
                                   "params": {"width": 5}}}).model
shipped = ship_paths(model)
connect(RayConfig(address=address), py_modules=shipped)
# Uploaded at connect; now the project is gone, as it is on any other machine: the driver's
# sys.path (which Ray hands to workers) no longer finds it, only Ray's copy can.
import shutil
shutil.rmtree(sys.argv[2])

@ray.remote(resources={"trainslot": 1}, num_cpus=0)
def build_here(model_config):
    import tf_mn_models
    import torch
    from training.model.networks import build_model
    from training.config import ModelConfig
    net = build_model(ModelConfig(**model_config), [64], 10)
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "file": tf_mn_models.__file__,
        "out": list(net(torch.zeros(2, 64)).shape),
    }

found = ray.get([build_here.remote(model.model_dump()) for _ in range(2)])
print(json.dumps({"shipped": shipped, "found": found}))
"""
NETS = """
import math
from torch import nn

def build(spec, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width),
                         nn.Linear(width, spec.num_outputs))
"""


def test_a_project_factory_is_imported_on_both_nodes_from_py_modules(ray_cluster, tmp_path):
    project = tmp_path / "project"
    package = project / "tf_mn_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(NETS))
    env = {**ray_cluster.env, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, ray_cluster.address, str(project)],
        cwd=project,  # the user's project: the factory is found in the working directory
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["shipped"] == [str(package)]
    found = result["found"]
    assert len({f["node"] for f in found}) == 2, found  # one slot per node: both nodes
    for one in found:
        assert one["out"] == [2, 10]
        # Ray's unpacked copy of the py_modules upload, not the project directory
        assert not one["file"].startswith(str(project)), one
        assert "py_modules_files" in one["file"], one
        assert os.path.basename(os.path.dirname(one["file"])) == "tf_mn_models"
