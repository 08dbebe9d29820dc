"""An image folder through Ray Data: Ray's image reader and the driver's decode
give the same rows (grey and RGB, PNG and JPEG, mixed sizes), preprocessing writes its splits,
and a corrupt image among good ones is one error naming it, with nothing written."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from training.config import DataConfig, PipelineConfig
from training.data.image_files import read_images_here
from training.data.inputs import fingerprint, input_format, resolve_inputs
from training.data.preprocess import MANIFEST_FILE, preprocess
from training.data.read import read_input
from training.data.schema import check_schema
from training.datasets.synthetic_images import write_digit_images
from training.errors import DataValidationError
from training.storage import StorageLayout

pytestmark = pytest.mark.integration


def _colour_tree(root, rows: int) -> str:
    """Random RGB pictures of mixed sizes, PNG and JPEG, RGBA and palette among them."""
    rng = np.random.default_rng(3)
    for index in range(rows):
        folder = root / ("red" if index % 2 else "blue")
        folder.mkdir(parents=True, exist_ok=True)
        size = (9 + index % 5, 7 + index % 3)
        picture = Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))
        if index % 3 == 0:
            picture.save(folder / f"{index}.jpg", format="JPEG")
            continue
        picture = picture.convert(("RGBA", "P")[index % 2])
        picture.save(folder / f"{index}.png")
    return str(root)


def _rows(frames) -> pd.DataFrame:
    return pd.concat(list(frames)).sort_values("path").reset_index(drop=True)


@pytest.mark.parametrize("kind", ["grey", "rgb"])
def test_rays_reader_and_the_drivers_decode_give_the_same_rows(ray_local, tmp_path, kind):
    if kind == "grey":
        root, shape = write_digit_images(tmp_path / "digits", 30), [1, 12, 12]
    else:
        root, shape = _colour_tree(tmp_path / "colour", 30), [3, 8, 10]
    data = DataConfig(source=root, image_shape=shape)
    files = resolve_inputs(data)
    plan = check_schema(data, files, input_format(data, files), None)
    by_ray = _rows([read_input(files, plan, None).to_pandas()])
    here = _rows(t.to_pandas() for t in read_images_here(files, plan))
    assert len(by_ray) == len(files) == 30
    assert list(by_ray["path"]) == list(here["path"])
    assert list(by_ray["label"]) == list(here["label"])
    ray_pixels, here_pixels = np.stack(by_ray["image"]), np.stack(here["image"])
    assert ray_pixels.shape == (30, int(np.prod(shape)))
    np.testing.assert_array_equal(ray_pixels, here_pixels)


def test_a_corrupt_image_is_one_error_naming_it_and_nothing_is_written(ray_local, tmp_path):
    root = write_digit_images(tmp_path / "digits", 60)
    bad = tmp_path / "digits" / "4" / "broken.png"
    picture = io.BytesIO()
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(picture, format="PNG")
    bad.write_bytes(picture.getvalue()[:40])
    storage = tmp_path / "storage"
    config = PipelineConfig(data=DataConfig(source=root, image_shape=[1, 16, 16]))
    files = resolve_inputs(config.data)
    with pytest.raises(DataValidationError) as caught:
        preprocess(config, StorageLayout(root=str(storage)), fingerprint(config.data, files), files)
    message = str(caught.value)
    assert message.startswith(f"cannot read {bad} as images: "), message
    assert "Traceback" not in message
    written = list(storage.rglob("*")) if storage.exists() else []
    assert not [p for p in written if p.name == MANIFEST_FILE or p.name.startswith("_incoming")]


def test_an_image_folder_preprocesses_into_splits(ray_local, tmp_path):
    root = write_digit_images(tmp_path / "digits", 120)
    config = PipelineConfig(data=DataConfig(source=root, image_shape=[1, 16, 16]))
    files = resolve_inputs(config.data)
    layout = StorageLayout(root=str(tmp_path / "storage"))
    manifest = preprocess(config, layout, fingerprint(config.data, files), files)
    assert sum(manifest.rows.values()) == 120
    assert manifest.spec.image_column == "image"
    assert manifest.spec.input_shape == [1, 16, 16]
    assert sorted(manifest.spec.classes) == [str(d) for d in range(10)]


def test_a_table_of_image_paths_preprocesses_and_finds_its_raw_rows(ray_local, tmp_path):
    from training.data.splits import raw_rows

    root = write_digit_images(tmp_path / "digits", 120)
    files = sorted(Path(root).glob("*/*.png"))
    table = tmp_path / "images.jsonl"
    frame = pd.DataFrame({"file": [str(f.relative_to(tmp_path)) for f in files]})
    frame["digit"] = [f.parent.name for f in files]
    frame.to_json(table, orient="records", lines=True)
    data = DataConfig(
        source=str(table), image_column="file", label_column="digit", image_shape=[1, 16, 16]
    )
    config = PipelineConfig(data=data)
    inputs = resolve_inputs(config.data)
    layout = StorageLayout(root=str(tmp_path / "storage"))
    manifest = preprocess(config, layout, fingerprint(config.data, inputs), inputs)
    assert sum(manifest.rows.values()) == 120
    assert manifest.spec.input_shape == [1, 16, 16]
    rows = raw_rows(manifest, "test", 3)
    assert len(rows) == 3 and len(rows["file"].iloc[0]) == 256
