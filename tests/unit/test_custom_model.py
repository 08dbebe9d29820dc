"""model.kind custom (a user's factory), resnet18 and train.strategy: config parsing, the
factory's checks (each bad case -> one ConfigError naming model.factory), the spec, where the
user's code is shipped, and ResNet-18's shapes. No Ray."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from training.config import validate_config
from training.errors import ConfigError
from training.model.factory import (
    ModelSpec,
    check_factory,
    code_paths,
    requirements,
    ship_paths,
)
from training.model.trainflow_pyfunc.networks import build_network
from training.model.trainflow_pyfunc.resnet import ResNet18

USER_CODE = """
import math
from torch import nn

def build(spec, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width),
                         nn.ReLU(), nn.Linear(width, spec.num_outputs))

def images(spec, width=4):
    channels = spec.input_shape[0]
    return nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(width, spec.num_outputs))

def raises(spec):
    raise RuntimeError("no GPU here")

def not_a_module(spec):
    return "a string"

def wrong_outputs(spec):
    return nn.Linear(spec.input_shape[0], 3)

def wrong_input(spec):
    return nn.Linear(7, spec.num_outputs)

NOT_CALLABLE = 42
"""


@pytest.fixture(scope="module")
def user_package(tmp_path_factory):
    """A package in a project directory (not installed), importable through sys.path."""
    root = tmp_path_factory.mktemp("project")
    package = root / "tf_unit_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(USER_CODE))
    (package / "broken.py").write_text("import numpy\nraise ValueError('bad module')\n")
    sys.path.insert(0, str(root))
    yield package
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith("tf_unit_models")]:
        del sys.modules[name]


def _model(factory: str, **params):
    return validate_config(
        {"model": {"kind": "custom", "factory": factory, "params": params}}
    ).model


TABLE = ModelSpec.of([64], 10)


# --- config -----------------------------------------------------------------------------------


def test_custom_needs_a_factory_of_the_form_package_module_function():
    for bad in (
        {"kind": "custom"},
        {"kind": "mlp", "factory": "a.b:c"},
        {"kind": "custom", "factory": "a.b"},
        {"kind": "custom", "factory": "a-b.c:d"},
    ):
        with pytest.raises(ConfigError, match="model.factory"):
            validate_config({"model": bad})
    model = validate_config({"model": {"kind": "custom", "factory": "pkg.mod:fn"}}).model
    assert model.params == {} and model.factory == "pkg.mod:fn"


def test_model_params_are_sweepable_and_reach_the_trial_config_and_mlflow_params():
    config = validate_config(
        {
            "model": {"kind": "custom", "factory": "pkg.mod:fn", "params": {"depth": 2}},
            "sweep": {"search_space": {"model.params.width": {"choice": [8, 16]}}},
        }
    )
    trial = config.with_overrides({"model.params.width": 16})
    assert trial.model.params == {"depth": 2, "width": 16}
    assert trial.flat()["model.params.width"] == 16  # the train run's and trials' params
    # Only a custom model has factory params.
    with pytest.raises(ConfigError, match="model.params.width"):
        validate_config({"sweep": {"search_space": {"model.params.width": {"choice": [8]}}}})


def test_resnet18_and_strategy_keys():
    config = validate_config({"model": {"kind": "resnet18"}, "train": {"strategy": "fsdp"}})
    assert config.data.image_shape == [1, 8, 8]  # the digits' shape, as for cnn
    assert config.train.strategy == "fsdp"
    with pytest.raises(ConfigError, match="resnet18 needs data.image_shape"):
        validate_config({"model": {"kind": "resnet18"}, "data": {"source": "/data/x.parquet"}})
    with pytest.raises(ConfigError, match="train.strategy"):
        validate_config({"train": {"strategy": "zero3"}})


# --- the factory's checks -----------------------------------------------------------------------


def test_a_good_factory_passes_with_tables_and_images(user_package):
    check_factory(_model("tf_unit_models.nets:build", width=4), TABLE, {"width": 16})
    check_factory(_model("tf_unit_models.nets:images"), ModelSpec.of([3, 16, 16], 5))


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("tf_unit_models.missing:build", "cannot import 'tf_unit_models.missing'"),
        ("no_such_package_xyz.nets:build", "install the package, or run trainflow from"),
        ("tf_unit_models.nets:absent", "has no attribute 'absent'"),
        ("tf_unit_models.broken:build", "raised ValueError: bad module"),
        ("tf_unit_models.nets:NOT_CALLABLE", "int is not callable"),
        ("tf_unit_models.nets:raises", "raised RuntimeError: no GPU here"),
        ("tf_unit_models.nets:not_a_module", "returned str, not a torch.nn.Module"),
        ("tf_unit_models.nets:wrong_outputs", "to (2, 3), not (2, 10)"),
        ("tf_unit_models.nets:wrong_input", "fails on a batch of shape (2, 64)"),
    ],
)
def test_each_bad_factory_is_one_config_error_naming_model_factory(user_package, factory, says):
    with pytest.raises(ConfigError) as excinfo:
        check_factory(_model(factory), TABLE)
    message = str(excinfo.value)
    assert message.startswith(f"model.factory={factory!r}: "), message
    assert says in message, message
    assert "\n" not in message


def test_a_swept_keyword_the_factory_refuses_fails_before_the_sweep(user_package):
    with pytest.raises(ConfigError, match="unexpected keyword argument 'depth'"):
        check_factory(_model("tf_unit_models.nets:build"), TABLE, {"depth": 3})


def test_the_network_rebuilds_from_the_checkpointed_config(user_package):
    model = _model("tf_unit_models.nets:build", width=6)
    net = build_network(model.model_dump(mode="json"), [64], 10)
    assert net(torch.zeros(3, 64)).shape == (3, 10)
    assert net.state_dict()["net.1.weight"].shape == (6, 64)  # the user's module under "net."
    images = build_network(_model("tf_unit_models.nets:images").model_dump(), [3, 8, 8], 4)
    assert images(torch.zeros(2, 3 * 8 * 8)).shape == (2, 4)  # flat rows reshaped to C, H, W


def test_a_project_package_is_shipped_an_installed_one_is_a_requirement(user_package):
    model = _model("tf_unit_models.nets:build")
    assert ship_paths(model) == [str(user_package)]
    assert code_paths(model.model_dump()) == [str(user_package)]
    assert requirements(model.model_dump()) == []
    installed = _model("sklearn.linear_model:LogisticRegression")
    assert ship_paths(installed) == []  # the nodes have it, like trainflow's own dependencies
    assert code_paths(installed.model_dump()) == []
    assert [r.split("==")[0] for r in requirements(installed.model_dump())] == ["scikit-learn"]
    assert code_paths({"kind": "mlp"}) == [] and ship_paths(_model("torch.nn:Linear")) == []


def test_the_working_directory_is_searched_last(tmp_path, monkeypatch):
    (tmp_path / "tf_cwd_models.py").write_text(textwrap.dedent(USER_CODE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    check_factory(_model("tf_cwd_models:build"), TABLE)
    assert ship_paths(_model("tf_cwd_models:build")) == [str(tmp_path / "tf_cwd_models.py")]
    sys.modules.pop("tf_cwd_models", None)


# --- the spec -----------------------------------------------------------------------------------


def test_the_spec_is_read_on_the_driver_from_the_files(tmp_path):
    import numpy as np
    import pandas as pd

    from training.stages.preflight import preview_spec, swept_params

    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 0.5], "label": ["x", "y", "x"]})
    frame.to_parquet(tmp_path / "t.parquet")
    config = validate_config(
        {
            "data": {"source": str(tmp_path / "t.parquet")},
            "model": {"kind": "custom", "factory": "p.m:f"},
            "sweep": {"search_space": {"model.params.width": {"choice": [8, 16]}}},
        }
    )
    spec = preview_spec(config, [str(tmp_path / "t.parquet")], None)
    assert spec == ModelSpec((2,), 2, "classification")
    assert swept_params(config) == {"width": 8}
    images = pd.DataFrame({"img": [np.zeros(12).tolist()] * 3, "label": [1, 2, 3]})
    images.to_parquet(tmp_path / "i.parquet")
    raw = {"data": {"source": str(tmp_path / "i.parquet"), "image_column": "img"}}
    config = validate_config({**raw, "model": {"kind": "custom", "factory": "p.m:f"}})
    assert preview_spec(config, [str(tmp_path / "i.parquet")], None) == ModelSpec((12,), 3)
    raw["data"]["image_shape"] = [3, 2, 2]
    config = validate_config({**raw, "model": {"kind": "custom", "factory": "p.m:f"}})
    assert preview_spec(config, [str(tmp_path / "i.parquet")], None).input_shape == (3, 2, 2)


# --- ResNet-18 ----------------------------------------------------------------------------------


def test_resnet18_is_torchvisions_architecture():
    net = ResNet18([3, 224, 224], 1000)  # the ImageNet stem for large images
    assert sum(p.numel() for p in net.parameters()) == 11_689_512  # torchvision's resnet18
    assert net.conv1.kernel_size == (7, 7) and isinstance(net.maxpool, torch.nn.MaxPool2d)
    assert [len(layer) for layer in (net.layer1, net.layer2, net.layer3, net.layer4)] == [2] * 4
    assert net(torch.zeros(1, 3 * 224 * 224)).shape == (1, 1000)


@pytest.mark.parametrize("shape", [[1, 8, 8], [3, 32, 32], [1, 28, 28]])
def test_resnet18_adapts_its_stem_and_head_to_small_images(shape):
    net = build_network({"kind": "resnet18"}, shape, 7).eval()
    assert net.conv1.in_channels == shape[0]
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, torch.nn.Identity)
    assert net.fc.out_features == 7
    with torch.no_grad():
        assert net(torch.zeros(2, shape[0] * shape[1] * shape[2])).shape == (2, 7)


def test_the_job_ships_a_project_factory_with_py_modules(user_package):
    from training.config import RayConfig
    from training.platform.cluster import job_runtime_env

    paths = ship_paths(_model("tf_unit_models.nets:build"))
    env = job_runtime_env(RayConfig(), None, paths)
    assert env["py_modules"] == [str(user_package)]
    shipped = job_runtime_env(RayConfig(ship_code=True), None, paths)
    assert [p.rsplit("/", 1)[-1] for p in shipped["py_modules"]] == ["training", "tf_unit_models"]
    assert "py_modules" not in job_runtime_env(RayConfig(), None, [])


def test_the_flow_checks_with_a_cached_manifest_s_spec(user_package, tmp_path):
    """The inspect-data task's check: a finished preprocessing of the same fingerprint gives
    the exact spec (no read of the data)."""
    from training.manifest import FeatureSpec, Manifest
    from training.stages.preflight import check_model
    from training.storage import StorageLayout

    raw = {
        "storage": {"root": str(tmp_path)},
        "model": {"kind": "custom", "factory": "tf_unit_models.nets:wrong_outputs"},
    }
    config = validate_config(raw)
    spec = FeatureSpec("label", list(range(4)), [5], [0.0] * 5, [1.0] * 5)
    manifest = Manifest("fp1", "x", "d", {}, {}, {}, spec)
    data_dir = tmp_path / "data" / "fp1"
    data_dir.mkdir(parents=True)
    assert StorageLayout.from_config(config).data_dir("fp1") == str(data_dir)
    (data_dir / "manifest.json").write_text(manifest.to_json())
    with pytest.raises(ConfigError, match=r"to \(2, 3\), not \(2, 4\)"):
        check_model(config, ["/nonexistent.parquet"], "fp1")
    raw["model"]["factory"] = "tf_unit_models.nets:build"
    check_model(validate_config(raw), ["/nonexistent.parquet"], "fp1")


def test_builtin_digits32_is_an_image_table_of_the_digits_upscaled(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.data.builtin import digits, ensure_digits32

    table = pq.read_table(ensure_digits32(tmp_path))
    assert table.num_rows == 1797 and table.column_names == ["image", "label"]
    assert table.schema.field("image").type == pa.list_(pa.float32(), 1024)
    images = np.stack(table.column("image").to_numpy(zero_copy_only=False)).reshape(-1, 32, 32)
    pixels, labels = digits()
    assert (table.column("label").to_numpy() == labels).all()
    assert images.min() >= 0 and images.max() <= 16
    # each 4x4 block's inside still holds its source pixel
    assert np.allclose(images[:, 1::4, 1::4], pixels.reshape(-1, 8, 8))
