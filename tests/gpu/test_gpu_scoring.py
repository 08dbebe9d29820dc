"""Scoring on a GPU: the scoring actor's model on CUDA gives the CPU's predictions (runs only
where CUDA is available: ``.venv/bin/pytest -m gpu tests/gpu``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_the_scoring_actor_on_cuda_scores_as_on_the_cpu(tmp_path):
    from training.inference.predictor import PyfuncPredictor, device_of
    from training.model.trainflow_pyfunc.networks import build_network
    from training.tracking import flavour

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=512), "b": rng.normal(size=512)})
    frame["y"] = np.where(frame["a"] + frame["b"] > 0, "up", "down")
    spec = {
        "label_column": "y",
        "classes": ["down", "up"],
        "input_shape": [2],
        "mean": [0.0, 0.0],
        "std": [1.0, 1.0],
        "feature_columns": ["a", "b"],
        "image_column": None,
    }
    config = {"kind": "mlp", "hidden_sizes": [16], "dropout": 0.0}
    torch.manual_seed(0)
    state = {"model": build_network(config, [2], 2).state_dict(), "spec": spec}
    state["model_config"] = config
    files = flavour.pack(flavour.save_model(state, str(tmp_path / "model"), frame.head(4)))

    on_gpu = PyfuncPredictor(files, label_column="y", device=device_of(True))
    assert on_gpu.model.unwrap_python_model().device.type == "cuda"
    on_cpu = PyfuncPredictor(files, label_column="y", device=device_of(False))
    np.testing.assert_allclose(
        on_gpu(frame)[["down", "up"]].to_numpy(),
        on_cpu(frame)[["down", "up"]].to_numpy(),
        atol=1e-4,
    )
