"""The registered model as an MLflow pyfunc, saved and loaded by MLflow itself: raw columns in
(spaces in names, ints, floats, an image column), labels of their own type and one probability
per class out; extra columns ignored, missing/mistyped columns and NaN refused by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from training.data.rows import transform_batch
from training.manifest import FeatureSpec
from training.model.trainflow_pyfunc.networks import build_network

MLP = {"kind": "mlp", "hidden_sizes": [16], "dropout": 0.0, "channels": [4], "cnn_hidden": 8}
CNN = {"kind": "cnn", "hidden_sizes": [16], "dropout": 0.0, "channels": [4], "cnn_hidden": 8}


def _trained_state(spec: dict, model_config: dict, frame: pd.DataFrame) -> dict:
    """A network trained a few steps on the frame (so its predictions are not constant)."""
    torch.manual_seed(0)
    net = build_network(model_config, spec["input_shape"], len(spec["classes"]))
    batch = transform_batch(frame, FeatureSpec.from_dict(spec), with_labels=True)
    x, y = torch.from_numpy(batch["features"]), torch.from_numpy(batch["label"])
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return {"model": net.eval().state_dict(), "spec": spec, "model_config": model_config}


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    """A table trainflow never saw: spaces in names, an int and a float column, string labels."""
    from training.tracking import flavour

    rng = np.random.default_rng(0)
    n = 120
    species = rng.choice(["cat", "dog", "eel"], size=n)
    legs = np.where(species == "eel", 0, 4).astype(np.int64) + rng.integers(0, 2, n)
    mass = np.where(species == "dog", 20.0, 4.0) + rng.normal(0, 1, n)
    frame = pd.DataFrame({"leg count": legs, "body mass kg": mass, "species name": species})
    spec = {
        "label_column": "species name",
        "classes": ["cat", "dog", "eel"],
        "input_shape": [2],
        "mean": [float(legs.mean()), float(mass.mean())],
        "std": [float(legs.std()), float(mass.std())],
        "feature_columns": ["leg count", "body mass kg"],
        "image_column": None,
    }
    state = _trained_state(spec, MLP, frame)
    path = flavour.save_model(state, str(tmp_path_factory.mktemp("tab") / "model"), frame.head(8))
    import mlflow.pyfunc

    return {"model": mlflow.pyfunc.load_model(path), "frame": frame, "state": state, "path": path}


def test_raw_table_in_labels_and_probabilities_out(tabular):
    model, frame = tabular["model"], tabular["frame"]
    out = model.predict(frame.drop(columns=["species name"]).assign(notes="ignored"))
    assert list(out.columns) == ["prediction", "cat", "dog", "eel"]
    assert set(out["prediction"]) <= {"cat", "dog", "eel"}
    assert all(isinstance(v, str) for v in out["prediction"])
    np.testing.assert_allclose(out[["cat", "dog", "eel"]].sum(axis=1), 1.0, rtol=1e-6)
    assert (out["prediction"] == frame["species name"]).mean() > 0.9
    # the same features as training's own transform: same network output
    state, spec = tabular["state"], FeatureSpec.from_dict(tabular["state"]["spec"])
    net = build_network(MLP, spec.input_shape, spec.num_classes)
    net.load_state_dict(state["model"])
    x = torch.from_numpy(transform_batch(frame, spec, with_labels=False)["features"])
    expected = torch.softmax(net.eval()(x), dim=1).detach().numpy()
    np.testing.assert_allclose(out[["cat", "dog", "eel"]].to_numpy(), expected, atol=1e-6)


def test_signature_names_the_raw_columns_and_outputs(tabular):
    from mlflow.models import Model

    meta = Model.load(tabular["path"])
    inputs = {c.name: c.type.name for c in meta.signature.inputs.inputs}
    assert inputs == {"leg count": "long", "body mass kg": "double"}
    outputs = [c.name for c in meta.signature.outputs.inputs]
    assert outputs == ["prediction", "cat", "dog", "eel"]
    assert meta.saved_input_example_info["type"] == "dataframe"
    with open(f"{tabular['path']}/requirements.txt") as fh:
        names = sorted(line.split("==")[0] for line in fh.read().split() if line)
    assert names == ["mlflow", "numpy", "pandas", "torch"]
    code = Model.load(tabular["path"]).flavors["python_function"]
    assert code["loader_module"] == "mlflow.pyfunc.loaders.code_model"  # code, not a pickle


@pytest.mark.parametrize(
    "case, change, named",
    [
        ("missing column", lambda f: f.drop(columns=["body mass kg"]), "body mass kg"),
        ("mistyped column", lambda f: f.assign(**{"leg count": f["leg count"] + 0.5}), "leg count"),
        ("NaN in a feature", lambda f: f.assign(**{"body mass kg": np.nan}), "body mass kg"),
        ("empty table", lambda f: f.iloc[:0], "no rows"),
    ],
)
def test_bad_input_is_refused_by_name(tabular, case, change, named):
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as excinfo:
        tabular["model"].predict(change(tabular["frame"].drop(columns=["species name"])))
    assert named in str(excinfo.value), case
    assert excinfo.value.get_http_status_code() == 400


def test_our_predict_wrapper_names_the_column(tabular):
    from training.errors import DataValidationError
    from training.tracking import flavour

    frame = tabular["frame"].drop(columns=["body mass kg"])
    with pytest.raises(DataValidationError) as excinfo:
        flavour.predict(tabular["model"], frame)
    assert "body mass kg" in str(excinfo.value)
    assert len(str(excinfo.value)) < 400  # the error, not a dump of the data


def test_image_column_and_int_labels(tmp_path):
    import mlflow.pyfunc

    from training.tracking import flavour

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 64)
    images = [(rng.normal(0, 0.3, 16) + 2.0 * lab).astype(np.float32) for lab in labels]
    frame = pd.DataFrame({"pixels grid": images, "digit": labels, "source file": "a.png"})
    flat = np.stack(images).astype(np.float64)
    spec = {
        "label_column": "digit",
        "classes": [0, 1],
        "input_shape": [1, 4, 4],
        "mean": flat.mean(axis=0).tolist(),
        "std": flat.std(axis=0).tolist(),
        "feature_columns": None,
        "image_column": "pixels grid",
    }
    state = _trained_state(spec, CNN, frame)
    path = flavour.save_model(state, str(tmp_path / "model"), frame.head(4))
    model = mlflow.pyfunc.load_model(path)
    out = model.predict(frame.drop(columns=["digit"]))
    assert out["prediction"].dtype == np.int64
    assert list(out.columns) == ["prediction", "0", "1"]
    assert (out["prediction"].to_numpy() == labels).mean() > 0.9
    as_lists = frame.assign(**{"pixels grid": [list(map(float, v)) for v in images]})
    np.testing.assert_allclose(model.predict(as_lists)[["0", "1"]], out[["0", "1"]], atol=1e-6)
    short = frame.assign(**{"pixels grid": [v[:9] for v in images]})
    with pytest.raises(Exception, match="pixels grid"):
        model.predict(short)


def test_a_ray_data_actor_error_comes_back_as_our_one_message():
    """Ray Data returns an actor's UDF error as text (UserCodeException): predict and evaluate
    re-raise our error from it, so the CLI prints one line naming the column, exit code 2."""
    from training.errors import DataValidationError
    from training.inference.predictor import our_errors

    text = (
        "ray::MapWorker(MapBatches(PyfuncPredictor)).submit() ...\n"
        "training.errors.DataValidationError: the model refused the input: Model is missing "
        "inputs ['pixel_07'].\n"
    )
    with pytest.raises(DataValidationError) as excinfo, our_errors():
        raise RuntimeError(text)
    assert str(excinfo.value) == (
        "the model refused the input: Model is missing inputs ['pixel_07']."
    )
    with pytest.raises(KeyError), our_errors():  # anything else passes through untouched
        raise KeyError("x")


def test_the_batch_predictor_scores_arrow_batches_of_uint8_images(tmp_path):
    """Ray Data hands the predictor Arrow batches: an image column of fixed-size uint8 lists and
    int64 labels, as `trainflow make-data --kind images` writes them (Ray's own pandas batches
    of such a table were refused by MLflow's schema check at 200,000 images)."""
    import pyarrow as pa

    from training.inference.predictor import CONFIDENCE, TRUE_LABEL, PyfuncPredictor
    from training.tracking import flavour

    rng = np.random.default_rng(2)
    labels = rng.integers(0, 2, 64)
    pixels = np.stack([np.clip(rng.normal(60 + 120 * lab, 20, 16), 0, 255) for lab in labels])
    pixels = pixels.astype(np.uint8)
    table = pa.table(
        {
            "image": pa.FixedSizeListArray.from_arrays(pa.array(pixels.ravel()), 16),
            "digit": pa.array(labels, pa.int64()),
        }
    )
    frame = table.to_pandas()  # as pandas.read_parquet reads the files
    flat = pixels.astype(np.float64)
    spec = {
        "label_column": "digit",
        "classes": [0, 1],
        "input_shape": [1, 4, 4],
        "mean": flat.mean(axis=0).tolist(),
        "std": flat.std(axis=0).tolist(),
        "feature_columns": None,
        "image_column": "image",
    }
    path = flavour.save_model(
        _trained_state(spec, CNN, frame), str(tmp_path / "model"), frame.head(4)
    )
    files = flavour.pack(path)

    evaluated = PyfuncPredictor(files, label_column="digit")(table)
    assert list(evaluated.columns) == ["prediction", "0", "1", TRUE_LABEL]
    assert (evaluated["prediction"].to_numpy() == labels).mean() > 0.9
    pd.testing.assert_frame_equal(evaluated, PyfuncPredictor(files, label_column="digit")(frame))

    predicted = PyfuncPredictor(files)(table.drop_columns(["digit"]))
    assert isinstance(predicted, pa.Table)  # the inputs keep their Arrow types in the output
    assert predicted.schema.field("image").type == table.schema.field("image").type
    assert predicted.column_names == ["image", "prediction", "0", "1", CONFIDENCE]
    np.testing.assert_array_equal(predicted["prediction"].to_numpy(), evaluated["prediction"])


def test_the_model_runs_where_it_is_told(tabular, monkeypatch):
    """MLflow's rule for PyTorch models: ``model_config={"device": ...}`` at load, else
    ``MLFLOW_DEFAULT_PREDICTION_DEVICE``, else the GPU when there is one (``meta`` here stands
    for a device this machine does not have)."""
    import mlflow.pyfunc

    def device_of(model):
        python_model = model.unwrap_python_model()
        assert {p.device for p in python_model.network.parameters()} == {python_model.device}
        return python_model.device.type

    path = tabular["path"]
    assert device_of(mlflow.pyfunc.load_model(path, model_config={"device": "meta"})) == "meta"
    monkeypatch.setenv("MLFLOW_DEFAULT_PREDICTION_DEVICE", "meta")
    assert device_of(mlflow.pyfunc.load_model(path)) == "meta"
    assert device_of(mlflow.pyfunc.load_model(path, model_config={"device": "cpu"})) == "cpu"
    monkeypatch.delenv("MLFLOW_DEFAULT_PREDICTION_DEVICE")
    assert device_of(mlflow.pyfunc.load_model(path)) == (
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    from training.model.trainflow_pyfunc.model import prediction_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert prediction_device({"device": None}) == "cuda"
    assert prediction_device({"device": "cpu"}) == "cpu"


def test_a_scoring_actor_holds_a_gpu_only_with_use_gpu(tabular, monkeypatch):
    """With ``train.use_gpu`` the scoring actor asks Ray for a GPU and loads the model there;
    without, it stays on the CPU even where a GPU is visible (one Ray did not give it)."""
    import ray

    from training.errors import ConfigError
    from training.inference.predictor import PyfuncPredictor, device_of, scoring_actor
    from training.tracking import flavour

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    assert scoring_actor(True)["num_gpus"] == 1
    assert "num_gpus" not in scoring_actor(False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ConfigError, match="no GPU to score on"):
        scoring_actor(True)  # it would wait for a GPU forever
    assert (device_of(True), device_of(False)) == ("cuda", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    files = flavour.pack(tabular["path"])
    assert PyfuncPredictor(files).model.unwrap_python_model().device.type == "cpu"
    on_meta = PyfuncPredictor(files, device="meta").model.unwrap_python_model()
    assert on_meta.device.type == "meta"


def test_models_registered_under_the_old_class_name_still_load():
    """A model registered before the rename imports ``TrainflowClassifier`` from whichever
    ``trainflow_pyfunc`` the process imported first: that name is the one class."""
    from training.model.trainflow_pyfunc import model

    assert model.TrainflowClassifier is model.TrainflowModel
