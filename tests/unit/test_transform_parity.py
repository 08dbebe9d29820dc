"""Train/serve parity: the same raw rows through the training path (``output_rows`` and
``transform_batch``, the functions preprocessing maps over Ray Data batches) and through the
registered model (MLflow's pyfunc, the tensor handed to its network) give identical tensors.

Tables: numbers of mixed widths with a constant column (its std is 0); a table with gaps,
categories (one value unseen in training, served too) and a datetime column; free text (hashed
n-grams, a missing text and words never seen in training); an image column as
Arrow fixed-size lists, as Arrow variable-length lists and as numpy arrays; a regression's
label."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from training.config import SplitConfig
from training.data.rows import output_rows, transform_batch
from training.manifest import FEATURES, LABEL, FeatureSpec
from training.model.trainflow_pyfunc.networks import build_network

MLP = {"kind": "mlp", "hidden_sizes": [8], "dropout": 0.0, "channels": [4], "cnn_hidden": 8}
CNN = {"kind": "cnn", "hidden_sizes": [8], "dropout": 0.0, "channels": [4], "cnn_hidden": 8}
ROWS = 48


def _saved(spec: dict, model_config: dict, frame: pd.DataFrame, tmp_path) -> str:
    """The model directory as trainflow saves it (untrained weights: only its input matters)."""
    from training.tracking import flavour

    torch.manual_seed(0)
    outputs = 1 if spec.get("task") == "regression" else len(spec["classes"])
    network = build_network(
        model_config, spec["input_shape"], outputs, spec.get("task"), spec.get("cardinalities")
    )
    state = {"model": network.state_dict(), "spec": spec, "model_config": model_config}
    example = frame.drop(columns=[spec["label_column"]]).head(4)
    return flavour.save_model(state, str(tmp_path / "model"), example)


def _served(spec: dict, model_config: dict, frame: pd.DataFrame, tmp_path):
    """The model as MLflow loads it."""
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(_saved(spec, model_config, frame, tmp_path))


def _network_input(model, rows, score=None) -> np.ndarray:
    """What the served model hands its network for these raw rows (``score``: how they are
    scored; MLflow's ``predict`` by default)."""
    seen = []
    python_model = model.unwrap_python_model()
    hook = python_model.network.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    try:
        (score or model.predict)(rows)
    finally:
        hook.remove()
    (features,) = seen
    return features.cpu().numpy()


def _trained_on(spec: FeatureSpec, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """What training feeds the network: the written rows' features and labels, which must be
    what ``transform_batch`` gives too."""
    written = output_rows(frame, spec, SplitConfig())
    features = np.stack(written[FEATURES].to_numpy(zero_copy_only=False)).astype(np.float32)
    labels = written[LABEL].to_numpy()
    direct = transform_batch(frame, spec, with_labels=True)
    np.testing.assert_array_equal(direct["features"], features)
    np.testing.assert_array_equal(direct["label"], labels)
    return {"features": features, "label": labels}


def _assert_same(served: np.ndarray, trained: np.ndarray) -> None:
    assert served.dtype == trained.dtype == np.float32
    assert served.shape == trained.shape
    np.testing.assert_array_equal(served, trained)


def test_a_numeric_table_gives_the_network_the_same_tensor(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "count": rng.integers(0, 9, ROWS).astype(np.int32),
            "mass kg": rng.normal(50, 9, ROWS),
            "ratio": rng.random(ROWS).astype(np.float32),
            "constant": np.full(ROWS, 3.0),
            "species": rng.choice(["cat", "dog"], ROWS),
        }
    )
    columns = ["count", "mass kg", "ratio", "constant"]
    raw = frame[columns].to_numpy(np.float64)
    spec = {
        "label_column": "species",
        "classes": ["cat", "dog"],
        "input_shape": [len(columns)],
        "mean": raw.mean(axis=0).tolist(),
        "std": raw.std(axis=0).tolist(),  # the constant column's is 0
        "feature_columns": columns,
        "image_column": None,
    }
    assert 0.0 in spec["std"]
    trained = _trained_on(FeatureSpec.from_dict(spec), frame)
    model = _served(spec, MLP, frame, tmp_path)
    _assert_same(_network_input(model, frame.drop(columns=["species"])), trained["features"])
    assert np.isfinite(trained["features"]).all()


def _mixed_table(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    size = rng.normal(10, 3, rows)
    size[::7] = np.nan
    island = rng.choice(["Biscoe", "Dream", "Torgersen"], rows).astype(object)
    island[::11] = None
    return pd.DataFrame(
        {
            "size": size,
            "count": rng.integers(0, 50, rows),  # int64: the served signature must take it
            "island": island,
            "flag": rng.random(rows) > 0.5,
            "seen": pd.date_range("2022-03-01", periods=rows, freq="13h"),
            "species": rng.choice(["cat", "dog"], rows),
        }
    )


def test_a_table_with_gaps_categories_and_dates_gives_the_same_tensor(tmp_path):
    import pickle

    import pyarrow.parquet as pq

    from training.config import DataConfig
    from training.data.schema import check_schema
    from training.data.summary import Stats, summarise
    from training.data.validate import feature_spec, validate

    fit_rows = _mixed_table(200, 0)
    path = str(tmp_path / "fit.parquet")
    pq.write_table(pa.Table.from_pandas(fit_rows, preserve_index=False), path)
    data = DataConfig(source=path, label_column="species")
    plan = check_schema(data, [path], "parquet", None)
    stats = Stats()
    stats.add(pickle.loads(summarise(fit_rows, plan, data.split)["summary"][0]))
    task, _, classes = validate(stats, data, plan, [path])
    spec = feature_spec(stats, data, plan, classes, task)
    assert spec.categories["island"] and spec.datetime_columns == ["seen"]

    frame = _mixed_table(ROWS, 1)
    frame.loc[:4, "island"] = "Atlantis"  # never seen in training: unknown, on both paths
    frame.loc[5:8, "seen"] = pd.NaT
    as_ray = pa.Table.from_pandas(frame, preserve_index=False)
    trained = _trained_on(spec, _as_ray_hands_it(as_ray))
    model = _served(spec.to_dict(), MLP, frame, tmp_path)
    _assert_same(_network_input(model, frame.drop(columns=["species"])), trained["features"])
    assert np.isfinite(trained["features"]).all()
    # Numbers of any width (int64 into a float column too), text as text, dates as dates.
    schema = model.metadata.get_input_schema().inputs
    types = {c.name: getattr(c.type, "name", str(c.type)) for c in schema}
    assert types == {
        "size": "Any",
        "count": "Any",
        "island": "string",
        "flag": "boolean",
        "seen": "datetime",
    }


def _text_table(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    words = np.array(["rates", "rise", "match", "goal", "album", "vote", "chip", "the", "of"])
    review = [" ".join(rng.choice(words, rng.integers(5, 12))).capitalize() for _ in range(rows)]
    return pd.DataFrame(
        {
            "review": pd.Series(review, dtype=object),
            "stars": rng.integers(1, 6, rows),
            "topic": rng.choice(["money", "sport"], rows),
        }
    )


def test_a_text_column_gives_the_network_the_same_tensor(tmp_path):
    import pickle

    import pyarrow.parquet as pq

    from training.config import DataConfig
    from training.data.schema import check_schema
    from training.data.summary import Stats, summarise
    from training.data.validate import feature_spec, validate

    fit_rows = _text_table(200, 0)
    path = str(tmp_path / "fit.parquet")
    pq.write_table(pa.Table.from_pandas(fit_rows, preserve_index=False), path)
    data = DataConfig(source=path, label_column="topic", text_features=64)
    plan = check_schema(data, [path], "parquet", None)
    stats = Stats()
    stats.add(pickle.loads(summarise(fit_rows, plan, data.split)["summary"][0]))
    task, _, classes = validate(stats, data, plan, [path])
    spec = feature_spec(stats, data, plan, classes, task)
    assert spec.text_columns == ["review"] and spec.input_shape == [1 + 64]

    frame = _text_table(ROWS, 1)
    frame.loc[0, "review"] = None
    frame.loc[1, "review"] = "Zebras never seen in training, and UPPER case"
    trained = _trained_on(spec, _as_ray_hands_it(pa.Table.from_pandas(frame, preserve_index=False)))
    model = _served(spec.to_dict(), MLP, frame, tmp_path)
    _assert_same(_network_input(model, frame.drop(columns=["topic"])), trained["features"])
    text = trained["features"][:, 1:]
    assert not text[0].any() and text[1].any()  # the missing text: zeros; unseen words hash
    np.testing.assert_allclose(np.linalg.norm(text[1:], axis=1), 1.0, rtol=1e-5)
    schema = model.metadata.get_input_schema().inputs
    assert {c.name: getattr(c.type, "name", str(c.type)) for c in schema}["review"] == "string"


def _images() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, ROWS)
    pixels = np.clip(rng.normal(40 + 60 * labels[:, None], 25, (ROWS, 16)), 0, 255)
    return pixels.astype(np.uint8), labels


def _image_table(pixels: np.ndarray, labels: np.ndarray, layout: str) -> pa.Table | pd.DataFrame:
    """The image rows as a file holds them: an Arrow table, or a frame of numpy arrays."""
    if layout == "numpy arrays":
        column = pd.Series(list(pixels), dtype=object)  # as read_parquet reads lists
        return pd.DataFrame({"image": column, "digit": labels})
    if layout == "arrow fixed-size lists":
        arrow = pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), 16)
    else:
        arrow = pa.array([list(map(int, row)) for row in pixels], pa.list_(pa.int16()))
    return pa.table({"image": arrow, "digit": pa.array(labels)})


def _as_ray_hands_it(rows: pa.Table | pd.DataFrame) -> pd.DataFrame:
    """A pandas batch as Ray Data hands one to a UDF: Arrow columns stay Arrow (ArrowDtype)."""
    return rows if isinstance(rows, pd.DataFrame) else rows.to_pandas(types_mapper=pd.ArrowDtype)


@pytest.fixture(scope="module")
def image_model(tmp_path_factory):
    pixels, labels = _images()
    flat = pixels.astype(np.float64)
    spec = {
        "label_column": "digit",
        "classes": [0, 1, 2],
        "input_shape": [1, 4, 4],
        "mean": flat.mean(axis=0).tolist(),
        "std": flat.std(axis=0).tolist(),
        "feature_columns": None,
        "image_column": "image",
    }
    frame = _image_table(pixels, labels, "numpy arrays")
    return spec, _saved(spec, CNN, frame, tmp_path_factory.mktemp("image"))


def _without(rows: pa.Table | pd.DataFrame, column: str) -> pa.Table | pd.DataFrame:
    return (
        rows.drop(columns=[column]) if isinstance(rows, pd.DataFrame) else rows.drop_columns(column)
    )


@pytest.mark.parametrize(
    "layout", ["arrow fixed-size lists", "arrow variable lists", "numpy arrays"]
)
def test_an_image_column_gives_the_network_the_same_tensor(image_model, layout):
    from training.inference.predictor import PyfuncPredictor
    from training.tracking import flavour

    spec, path = image_model
    pixels, labels = _images()
    rows = _image_table(pixels, labels, layout)
    batch = _as_ray_hands_it(rows)
    trained = _trained_on(FeatureSpec.from_dict(spec), batch)
    np.testing.assert_array_equal(trained["label"], labels)
    # Served by the scoring actor `trainflow predict` and evaluate run, on the rows as read.
    predictor = PyfuncPredictor(flavour.pack(path))
    served = _network_input(predictor.model, _without(rows, "digit"), predictor)
    _assert_same(served, trained["features"])
    # The shipped code itself on the batch as Ray hands it (Arrow columns stay Arrow; MLflow's
    # signature check, which the actor's own conversion satisfies, would refuse them first).
    python_model = predictor.model.unwrap_python_model()
    direct = _network_input(
        predictor.model, _without(batch, "digit"), lambda f: python_model.predict(None, f)
    )
    _assert_same(direct, trained["features"])
    # Every layout is the same image.
    as_arrays = _image_table(pixels, labels, "numpy arrays")
    _assert_same(
        trained["features"], _trained_on(FeatureSpec.from_dict(spec), as_arrays)["features"]
    )


def test_a_regression_label_goes_out_the_way_it_came_in(tmp_path):
    """The label training learns, handed back by the served model as its output, is the label."""
    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"x1": rng.normal(size=ROWS), "x2": rng.integers(0, 5, ROWS)})
    frame["price"] = 3.0 * frame["x1"] + frame["x2"] + rng.normal(200, 40, ROWS)
    raw = frame[["x1", "x2"]].to_numpy(np.float64)
    spec = {
        "label_column": "price",
        "classes": [],
        "input_shape": [2],
        "mean": raw.mean(axis=0).tolist(),
        "std": raw.std(axis=0).tolist(),
        "feature_columns": ["x1", "x2"],
        "image_column": None,
        "task": "regression",
        "label_mean": float(frame["price"].mean()),
        "label_std": float(frame["price"].std()),
    }
    trained = _trained_on(FeatureSpec.from_dict(spec), frame)
    assert trained["label"].dtype == np.float32
    model = _served(spec, MLP, frame, tmp_path)
    rows = frame.drop(columns=["price"])
    _assert_same(_network_input(model, rows), trained["features"])
    # A network that answers exactly training's targets: the served prediction is the label.
    network = model.unwrap_python_model().network
    target = torch.from_numpy(trained["label"][:, None].copy())
    hook = network.register_forward_hook(lambda *_: target)
    try:
        predicted = model.predict(rows)["prediction"].to_numpy()
    finally:
        hook.remove()
    np.testing.assert_allclose(predicted, frame["price"].to_numpy(), rtol=1e-6)


def test_an_arrow_backed_integer_column_keys_like_a_numpy_one():
    """Ray Data hands a UDF Arrow-backed columns: an int column declared categorical (or read
    from parquet with a gap) must give the same vocabulary keys as the numpy column does."""
    import pyarrow as pa

    from training.model.trainflow_pyfunc.transform_steps import category_keys

    arrow = pd.Series(pd.array([1, 2, None, 3], dtype=pd.ArrowDtype(pa.int64())))
    plain = pd.Series([1.0, 2.0, np.nan, 3.0])
    assert category_keys(arrow).tolist() == category_keys(plain).tolist()
    assert category_keys(arrow).tolist()[:2] == ["1", "2"] and pd.isna(category_keys(arrow)[2])
