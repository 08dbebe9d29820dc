"""Image folders: the class-folder layout and its errors, the decode and resize
(PIL, as Ray Data's image reader does it), and the served model's image step on encoded bytes."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from training.config import DataConfig
from training.data.diagnose import read_error
from training.data.image_files import list_images, read_images_here
from training.data.inputs import input_format, resolve_inputs
from training.data.schema import check_schema
from training.datasets.synthetic_images import write_digit_images
from training.errors import DataValidationError
from training.model.trainflow_pyfunc import transform
from training.model.trainflow_pyfunc.images import channels_first, decode
from training.model.trainflow_pyfunc.transform import TransformError


def _png(array: np.ndarray, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt)
    return out.getvalue()


def _ray_reader(data: bytes, height: int, width: int, mode: str) -> np.ndarray:
    """Ray 2.60's ImageDatasource._read_stream, step for step (it runs only inside a Ray task)."""
    image = Image.open(io.BytesIO(data))
    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.BILINEAR)
    if image.mode != mode:
        image = image.convert(mode)
    return np.asarray(image)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_digit_images(tmp_path_factory.mktemp("digits") / "digits", 40)


@pytest.mark.parametrize("shape", [[1, 12, 12], [3, 10, 14], [1, 24, 24]])
@pytest.mark.parametrize("source", ["grey", "rgb", "rgba", "palette", "jpeg"])
def test_decode_resizes_and_converts_as_rays_reader_does(shape, source):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (20, 16, 3), dtype=np.uint8)
    data = {
        "grey": lambda: _png(rgb[..., 0]),
        "rgb": lambda: _png(rgb),
        "rgba": lambda: _png(np.dstack([rgb, rgb[..., :1]])),
        "palette": lambda: _png_palette(rgb),
        "jpeg": lambda: _png(rgb, "JPEG"),
    }[source]()
    channels, height, width = shape
    expected = _ray_reader(data, height, width, "L" if channels == 1 else "RGB")
    if channels == 3:
        expected = expected.transpose(2, 0, 1)
    got = decode(data, shape)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, expected.ravel())


def _png_palette(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).convert("P").save(out, format="PNG")
    return out.getvalue()


def test_channels_first_puts_each_channel_whole():
    images = np.arange(2 * 3 * 4 * 3).reshape(2, 3, 4, 3)  # [n, H, W, C]
    rows = channels_first(images)
    assert rows.shape == (2, 36)
    np.testing.assert_array_equal(rows[1, :12], images[1, :, :, 0].ravel())
    np.testing.assert_array_equal(rows[1, 12:24], images[1, :, :, 1].ravel())
    np.testing.assert_array_equal(channels_first(images[..., 0]), images[..., 0].reshape(2, 12))


def test_a_class_folder_tree_is_an_image_input(folder):
    data = DataConfig(source=folder, image_shape=[1, 8, 8])
    files = resolve_inputs(data)
    assert len(files) == 40 and all(f.endswith(".png") for f in files)
    assert input_format(data, files) == "images"
    plan = check_schema(data, files, "images", None)
    assert (plan.image, plan.label, plan.image_shape) == ("image", "label", [1, 8, 8])
    (table,) = read_images_here(files, plan)
    assert table.column_names == ["image", "label", "path"]
    assert sorted(set(table.column("label").to_pylist())) == [str(d) for d in range(10)]
    assert table.column("image").type.list_size == 64


def test_an_image_folder_needs_its_image_shape(folder):
    data = DataConfig(source=folder)
    with pytest.raises(DataValidationError, match=r"set data.image_shape .*\[C, H, W\]"):
        check_schema(data, resolve_inputs(data), "images", None)
    data = DataConfig(source=folder, image_shape=[2, 8, 8])
    with pytest.raises(DataValidationError, match="1 .grey. or 3 .RGB. channels"):
        check_schema(data, resolve_inputs(data), "images", None)


def _tree(root, files: dict[str, bytes]):
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return str(root)


@pytest.mark.parametrize(
    ("files", "named", "reason"),
    [
        ({"cat/a.png": b"x", "cat/notes.txt": b"x"}, "cat/notes.txt", "is not an image file"),
        ({"cat/a.png": b"x", "b.png": b"x"}, "b.png", "is not in a class folder directly"),
        ({"cat/a.png": b"x", "cat/x/b.png": b"x"}, "cat/x/b.png", "not in a class folder"),
        ({"cat/a.png": b"x", "dog/.keep": b""}, "['dog']", "hold no images"),
    ],
)
def test_a_bad_tree_is_one_error_naming_the_file(tmp_path, files, named, reason):
    root = _tree(tmp_path / "images", files)
    with pytest.raises(DataValidationError, match=reason) as caught:
        list_images(root)
    assert named in str(caught.value)


def test_hidden_files_are_not_data(tmp_path):
    root = _tree(tmp_path / "images", {"cat/a.png": b"x", ".DS_Store": b"x", "cat/.b.png": b""})
    assert list_images(root) == [f"{root}/cat/a.png"]


def test_one_image_is_not_a_data_set(tmp_path):
    path = _tree(tmp_path / "images", {"cat/a.png": b"x"}) + "/cat/a.png"
    with pytest.raises(DataValidationError, match="is one image; point data.source at the folder"):
        resolve_inputs(DataConfig(source=path))


def test_a_corrupt_image_is_named_when_rays_read_fails(folder, tmp_path):
    root = _tree(tmp_path / "images", {"3/good.png": _png(np.zeros((8, 8), np.uint8))})
    bad = tmp_path / "images" / "3" / "bad.png"
    bad.write_bytes(_png(np.zeros((8, 8), np.uint8))[:30])  # truncated
    data = DataConfig(source=root, image_shape=[1, 8, 8])
    files = resolve_inputs(data)
    plan = check_schema(data, files, "images", None)
    # Ray's error for a truncated file does not name it: every file is tried on the driver.
    error = read_error(OSError("image file is truncated"), files, plan, None)
    assert error is not None
    assert str(error).startswith(f"cannot read {bad} as images: ")
    assert "re-export it or remove it" in str(error)


def _spec(shape):
    return {"image_column": "image", "input_shape": shape}


def test_the_image_step_decodes_encoded_bytes_and_base64_text(folder):
    data = DataConfig(source=folder, image_shape=[1, 12, 12])
    files = resolve_inputs(data)[:6]
    plan = check_schema(data, files, "images", None)
    (table,) = read_images_here(files, plan)
    trained = transform.raw_matrix(table.to_pandas(), _spec([1, 12, 12]))
    encoded = [Path(f).read_bytes() for f in files]
    served = transform.raw_matrix(pd.DataFrame({"image": encoded}), _spec([1, 12, 12]))
    np.testing.assert_array_equal(served, trained)
    text = [base64.b64encode(b).decode() for b in encoded]
    as_text = transform.raw_matrix(pd.DataFrame({"image": text}), _spec([1, 12, 12]))
    np.testing.assert_array_equal(as_text, trained)


def test_bytes_that_are_not_an_image_are_one_error_naming_the_column_and_row():
    good = _png(np.zeros((4, 4), np.uint8))
    frame = pd.DataFrame({"image": [good, b"not a png"]})
    expected = r"column .image. row 1 is not a readable image: not an image file PIL can read"
    with pytest.raises(TransformError, match=expected):
        transform.raw_matrix(frame, _spec([1, 4, 4]))


def _path_table(folder: str, tmp_path, absolute_rows: int = 0) -> str:
    """A CSV next to nothing: paths relative to the CSV's directory (the first
    ``absolute_rows`` absolute), labels from the class folders."""
    import os

    files = sorted(Path(folder).glob("*/*.png"))[:12]
    table = tmp_path / "table" / "images.csv"
    table.parent.mkdir()
    rows = [
        str(f) if i < absolute_rows else os.path.relpath(f, table.parent)
        for i, f in enumerate(files)
    ]
    pd.DataFrame({"file": rows, "digit": [f.parent.name for f in files]}).to_csv(table, index=False)
    return str(table)


def test_a_table_of_image_paths_reads_the_decoded_files(folder, tmp_path):
    from training.data.read import input_batches

    source = _path_table(folder, tmp_path, absolute_rows=3)
    data = DataConfig(
        source=source, image_column="file", label_column="digit", image_shape=[1, 10, 10]
    )
    files = resolve_inputs(data)
    plan = check_schema(data, files, input_format(data, files), None)
    assert plan.image_root == str(tmp_path / "table")
    (batch,) = list(input_batches(files, plan, None))
    expected = sorted(Path(folder).glob("*/*.png"))[:12]
    assert len(batch) == 12
    for got, file in zip(batch["file"], expected, strict=True):
        np.testing.assert_array_equal(got, decode(file.read_bytes(), [1, 10, 10]))


def test_a_missing_image_of_a_path_table_is_named(folder, tmp_path):
    source = _path_table(folder, tmp_path)
    frame = pd.read_csv(source)
    frame.loc[5, "file"] = "0/nowhere.png"
    frame.to_csv(source, index=False)
    data = DataConfig(source=source, image_column="file", image_shape=[1, 10, 10])
    data = data.model_copy(update={"label_column": "digit"})
    files = resolve_inputs(data)
    plan = check_schema(data, files, "csv", None)
    error = read_error(ValueError("a Ray task failed"), files, plan, None)
    assert error is not None
    nowhere = tmp_path / "table" / "0" / "nowhere.png"
    assert f"image {nowhere} (column 'file'): no such file" in str(error)


def test_a_path_table_needs_the_image_shape(folder, tmp_path):
    data = DataConfig(source=_path_table(folder, tmp_path), image_column="file")
    data = data.model_copy(update={"label_column": "digit"})
    with pytest.raises(DataValidationError, match="set data.image_shape"):
        check_schema(data, resolve_inputs(data), "csv", None)


def test_make_data_writes_an_image_folder_that_reads_as_one(tmp_path):
    from typer.testing import CliRunner

    from trainflow.cli import app

    out = tmp_path / "pngs"
    result = CliRunner().invoke(app, ["make-data", str(out), "--kind", "image-files", "-n", "50"])
    assert result.exit_code == 0, result.output
    assert "data.image_shape=[1,16,16]" in " ".join(result.output.split())
    files = resolve_inputs(DataConfig(source=str(out)))
    assert len(files) == 50
    assert {Path(f).parent.name for f in files} == {str(d) for d in range(10)}
    sizes = {Image.open(f).size for f in files}
    assert sizes == {(16, 16), (20, 20)}  # mixed sizes: the reader resizes them
    remote = CliRunner().invoke(app, ["make-data", "s3://b/p", "--kind", "image-files"])
    assert remote.exit_code == 2 and "local directory" in remote.output


def test_a_custom_models_spec_is_read_from_an_image_folder(folder):
    from training.config import validate_config
    from training.model.factory import ModelSpec
    from training.stages.preflight import preview_spec

    raw = {"source": folder, "image_shape": [1, 8, 8]}
    config = validate_config({"data": raw, "model": {"kind": "custom", "factory": "p.m:f"}})
    spec = preview_spec(config, resolve_inputs(config.data), None)
    assert spec == ModelSpec((1, 8, 8), 10)


def test_images_to_predict_need_no_class_folders(tmp_path):
    root = _tree(tmp_path / "new", {"a.png": b"x", "batch-2/b.jpg": b"x", "empty/.keep": b""})
    assert resolve_inputs(DataConfig(source=root), labelled=False) == [
        f"{root}/a.png",
        f"{root}/batch-2/b.jpg",
    ]
    with pytest.raises(DataValidationError, match="a.png is not in a class folder"):
        resolve_inputs(DataConfig(source=root))
    _tree(tmp_path / "new", {"notes.txt": b"x"})
    with pytest.raises(DataValidationError, match="notes.txt is not an image file"):
        resolve_inputs(DataConfig(source=root), labelled=False)
