"""A small trainflow checkpoint state and raw rows for it, shared by the registry tests."""

from __future__ import annotations

import numpy as np

FEATURES = ["sepal length", "sepal width", "petal length", "petal width"]


def trainflow_state(seed: int = 0) -> dict:
    """A trainflow checkpoint state: an MLP's weights, its feature spec and model config."""
    import torch

    from training.config import ModelConfig
    from training.model.networks import build_model

    torch.manual_seed(seed)
    config = ModelConfig(hidden_sizes=[8], dropout=0.0)
    spec = {
        "label_column": "species",
        "classes": ["setosa", "versicolor", "virginica"],
        "input_shape": [4],
        "mean": [5.8, 3.0, 3.7, 1.2],
        "std": [0.8, 0.4, 1.7, 0.8],
        "feature_columns": FEATURES,
        "image_column": None,
    }
    model = build_model(config, [4], 3).eval()
    return {"model": model.state_dict(), "spec": spec, "model_config": config.model_dump()}


def raw_rows(n: int = 5, seed: int = 0):
    import pandas as pd

    values = np.random.default_rng(seed).normal(loc=[5.8, 3.0, 3.7, 1.2], size=(n, 4))
    return pd.DataFrame(values, columns=FEATURES)
