"""Train/serve parity for image files: the same PNG/JPEG files through
training's path (the rows an image folder reads, through ``output_rows`` and
``transform_batch``) and through the registered model (MLflow's pyfunc, fed the files' encoded
bytes or their base64 text) give the network identical tensors. That training's rows are Ray
Data's image reader's: tests/integration/test_image_folder.py."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from test_transform_parity import CNN, _assert_same, _network_input, _saved, _trained_on

from training.config import DataConfig
from training.data.image_files import read_images_here
from training.data.inputs import input_format, resolve_inputs
from training.data.schema import check_schema
from training.datasets.synthetic_images import write_digit_images
from training.manifest import FeatureSpec


def _colour_folder(root: Path) -> str:
    rng = np.random.default_rng(5)
    for index in range(24):
        folder = root / ("red", "green", "blue")[index % 3]
        folder.mkdir(parents=True, exist_ok=True)
        picture = Image.fromarray(rng.integers(0, 256, (7 + index % 4, 9, 3), dtype=np.uint8))
        suffix = ".jpg" if index % 2 else ".png"
        picture.save(folder / f"{index}{suffix}")
    return str(root)


@pytest.fixture(scope="module", params=["grey png", "rgb png and jpeg"])
def images(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    if request.param == "grey png":
        source, shape = write_digit_images(root / "digits", 30), [1, 12, 12]
    else:
        source, shape = _colour_folder(root / "colour"), [3, 8, 8]
    data = DataConfig(source=source, image_shape=shape)
    files = resolve_inputs(data)
    plan = check_schema(data, files, input_format(data, files), None)
    rows = pd.concat(t.to_pandas() for t in read_images_here(files, plan))
    pixels = np.stack(rows["image"]).astype(np.float64)
    spec = {
        "label_column": "label",
        "classes": sorted(set(rows["label"])),
        "input_shape": shape,
        "mean": pixels.mean(axis=0).tolist(),
        "std": pixels.std(axis=0).tolist(),
        "feature_columns": None,
        "image_column": "image",
    }
    model = _saved(spec, CNN, rows.drop(columns=["path"]), tmp_path_factory.mktemp("model"))
    return spec, model, rows, [Path(f).read_bytes() for f in files]


@pytest.mark.parametrize("encoding", ["bytes", "base64 text"])
def test_image_files_give_the_network_the_same_tensor(images, encoding):
    import mlflow.pyfunc

    spec, model_dir, rows, encoded = images
    trained = _trained_on(FeatureSpec.from_dict(spec), rows)
    if encoding == "base64 text":
        encoded = [base64.b64encode(b).decode() for b in encoded]
    model = mlflow.pyfunc.load_model(model_dir)
    served = _network_input(model, pd.DataFrame({"image": encoded}))
    _assert_same(served, trained["features"])
