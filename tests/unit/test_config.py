"""The config schema: defaults, YAML files, ``--set`` overrides and the messages of bad input.

Pure: no Ray, no servers, no files outside tmp_path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from training.config import (
    BUILTIN_DIGITS,
    DIGITS_IMAGE_SHAPE,
    PipelineConfig,
    registered_model_name,
)
from training.config.overrides import load_config, parse_override
from training.errors import ConfigError, TrainflowError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_YAML = REPO_ROOT / "configs" / "default.yaml"
SMOKE_YAML = REPO_ROOT / "configs" / "smoke.yaml"


def config_error(overrides: list[str], path: str | Path | None = None) -> str:
    """The message of the ConfigError that loading these overrides must raise."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


# --- defaults and the two YAML files ----------------------------------------------------------


def test_defaults_load():
    config = load_config()
    assert isinstance(config, PipelineConfig)
    assert config.data.source == BUILTIN_DIGITS
    assert config.model.kind == "mlp"
    assert config.train.lr == pytest.approx(3e-3)
    assert config.train.num_workers == 2
    assert config.sweep.asha.grace_period <= config.sweep.asha.max_t
    assert config.mlflow.experiment == "trainflow"
    assert config.ray.address is None
    assert config.storage.root is None
    assert set(config.sweep.search_space) == {
        "train.lr",
        "train.weight_decay",
        "model.dropout",
        "train.batch_size",
    }


def test_default_yaml_gives_the_defaults():
    assert load_config(DEFAULT_YAML) == load_config()


def test_default_yaml_documents_every_key():
    """Each default is shown, commented, as ``# section.key: value``: the file is the reference."""
    text = DEFAULT_YAML.read_text()
    documented = set(re.findall(r"^# ([a-z_]+(?:\.[a-z_]+)+):", text, flags=re.M))
    missing = []
    for key in load_config().flat():
        if key.startswith("sweep.search_space."):
            key = "sweep.search_space"
        elif key.startswith("train.resources_per_worker."):
            key = "train.resources_per_worker"
        if key not in documented:
            missing.append(key)
    assert not missing, f"configs/default.yaml does not document: {missing}"


def test_default_yaml_comments_show_the_real_defaults():
    """A documented scalar default must equal the schema's (catches drift after a change)."""
    import yaml

    flat = load_config().flat()
    text = DEFAULT_YAML.read_text()
    checked = 0
    for key, shown in re.findall(r"^# ([a-z_]+(?:\.[a-z_]+)+):\s*(\S[^#]*?)\s*(?:#|$)", text, re.M):
        if key not in flat:
            continue
        assert yaml.safe_load(shown) == flat[key], f"default.yaml shows {key}: {shown}"
        checked += 1
    assert checked > 30


@pytest.mark.parametrize(
    ("source", "name"),
    [
        (BUILTIN_DIGITS, "digits"),
        ("builtin:diabetes", "diabetes"),
        ("/data/penguins.parquet", "penguins"),
        ("s3://b/claims/", "claims"),
        ("s3://b/claims", "claims"),
        ("data/claims 2024.csv.gz", "claims-2024"),
        ("s3://b/sensors/*.parquet", "sensors"),
        ("/data/(x)/", "x"),
    ],
)
def test_the_registered_model_is_named_after_the_data(source, name):
    assert load_config(None, [f"data.source={source}"]).mlflow.registered_model is None
    assert registered_model_name(load_config(None, [f"data.source={source}"])) == name
    assert registered_model_name(load_config()) == "digits"  # the default data


def test_a_registered_model_name_that_is_set_wins():
    config = load_config(None, ["data.source=/data/penguins.parquet", "mlflow.registered_model=m"])
    assert registered_model_name(config) == "m"
    assert registered_model_name(load_config(SMOKE_YAML)) == "digits-smoke"


def test_smoke_yaml_is_seconds_scale():
    config = load_config(SMOKE_YAML)
    assert config.sweep.num_samples == 4
    assert config.sweep.max_concurrent_trials == 2
    asha = config.sweep.asha
    assert (asha.max_t, asha.grace_period, asha.reduction_factor) == (3, 1, 2)
    assert config.train.max_epochs == 3
    assert config.train.num_workers == 2
    assert config.mlflow.experiment == "trainflow-smoke"
    assert config.mlflow.registered_model == "digits-smoke"
    lr = config.sweep.search_space["train.lr"]
    assert lr.loguniform == pytest.approx((1e-4, 3e-2))
    # Wide enough (more than two decades) that ASHA has a clearly bad trial to stop.
    assert lr.loguniform[1] / lr.loguniform[0] >= 100


def test_yaml_then_set_precedence():
    config = load_config(SMOKE_YAML, ["train.max_epochs=5"])
    assert config.train.max_epochs == 5
    assert config.sweep.num_samples == 4  # still from the file
    assert config.train.lr == pytest.approx(3e-3)  # still the schema default


# --- --set overrides: values are read as YAML -------------------------------------------------


def test_set_numbers():
    config = load_config(None, ["train.lr=0.01", "train.batch_size=32", "sweep.num_samples=16"])
    assert config.train.lr == pytest.approx(0.01)
    assert config.train.batch_size == 32
    assert config.sweep.num_samples == 16


def test_set_exponent_number():
    assert load_config(None, ["train.lr=1e-3"]).train.lr == pytest.approx(1e-3)


def test_set_list_makes_elastic_workers():
    config = load_config(None, ["train.num_workers=[1,2]"])
    assert config.train.num_workers == (1, 2)
    assert (config.train.min_workers, config.train.max_workers) == (1, 2)
    assert load_config(None, ["train.num_workers=[2, 2]"]).train.num_workers == 2


def test_set_list_of_ints():
    assert load_config(None, ["model.hidden_sizes=[32, 16, 8]"]).model.hidden_sizes == [32, 16, 8]


def test_set_null_and_empty_value():
    config = load_config(None, ["mlflow.tracking_uri=null", "storage.root=~"])
    assert config.mlflow.tracking_uri is None
    assert config.storage.root is None
    assert parse_override("mlflow.tracking_uri=") == ("mlflow.tracking_uri", None)


def test_set_bool_and_string():
    config = load_config(None, ["sweep.enabled=false", "data.label_column=species"])
    assert config.sweep.enabled is False
    assert config.data.label_column == "species"


def test_set_mapping_replaces_search_space():
    config = load_config(None, ["sweep.search_space={train.lr: {loguniform: [1.0e-4, 0.1]}}"])
    assert set(config.sweep.search_space) == {"train.lr"}


def test_parse_override_strips_whitespace():
    assert parse_override(" train.lr = 0.5") == ("train.lr", 0.5)


def test_set_one_search_space_domain():
    config = load_config(None, ["sweep.search_space.train.lr={loguniform: [1.0e-4, 0.1]}"])
    assert config.sweep.search_space["train.lr"].loguniform == pytest.approx((1e-4, 0.1))


@pytest.mark.parametrize("item", ["train.lr", "train.lr 0.01", "=0.01", " =3"])
def test_malformed_set(item):
    message = config_error([item])
    assert "--set" in message
    assert "KEY=VALUE" in message
    assert repr(item) in message


def test_set_value_that_is_not_yaml():
    message = config_error(["model.hidden_sizes=[1, 2"])
    assert "model.hidden_sizes" in message
    assert "not valid YAML" in message


def test_set_below_a_value_that_is_not_a_section():
    # Nothing else set train.lr: the override makes it a mapping, which the schema refuses.
    message = config_error(["train.lr.value=1"])
    assert "train.lr:" in message
    assert "valid number" in message
    # train.lr already holds a number: the path itself is refused.
    message = config_error(["train.lr=0.1", "train.lr.value=1"])
    assert "'train.lr.value'" in message
    assert "'lr' is not a section" in message
    with pytest.raises(ConfigError, match=r"'lr' is not a section"):
        load_config().with_overrides({"train.lr.value": 1})


# --- unknown keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("train.lrr=0.1", "train.lrr"),
        ("train.checkpoint.keep=3", "train.checkpoint.keep"),
        ("sweep.asha.max_epochs=3", "sweep.asha.max_epochs"),
        ("trian.lr=0.1", "trian"),
    ],
)
def test_unknown_key_names_the_dotted_key(item, named):
    message = config_error([item])
    assert f"{named}:" in message
    assert "unknown key" in message
    assert "trainflow config show" in message  # how to find the right spelling


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epochs: 3\n")
    message = config_error([], path)
    assert "train.epochs" in message
    assert "unknown key" in message


# --- bad values: the message names the key and what is allowed -------------------------------


def test_negative_lr():
    message = config_error(["train.lr=-0.1"])
    assert "train.lr" in message
    assert "greater than 0" in message
    assert "-0.1" in message


def test_batch_size_zero():
    message = config_error(["train.batch_size=0"])
    assert "train.batch_size" in message
    assert "greater than or equal to 1" in message


def test_grace_period_above_max_t():
    message = config_error(["sweep.asha.max_t=3", "sweep.asha.grace_period=5"])
    assert "sweep.asha.grace_period (5)" in message
    assert "sweep.asha.max_t (3)" in message
    assert "<=" in message


def test_unknown_model_kind():
    message = config_error(["model.kind=rnn"])
    assert "model.kind" in message
    assert "'mlp'" in message and "'cnn'" in message
    assert "rnn" in message


def test_more_workers_than_local_cpus():
    message = config_error(["train.num_workers=8", "ray.num_cpus=4"])
    assert "train.num_workers=8" in message
    assert "ray.num_cpus=4" in message
    assert "lower train.num_workers or raise ray.num_cpus" in message


def test_more_workers_than_local_cpus_is_fine_on_an_existing_cluster():
    config = load_config(None, ["train.num_workers=8", "ray.address=10.0.0.1:6379"])
    assert config.train.num_workers == 8


def test_elastic_workers_need_min_le_max():
    message = config_error(["train.num_workers=[3, 1]"])
    assert "train.num_workers" in message
    assert "1 <= min <= max" in message


def test_sweep_workers_per_trial_above_local_cpus():
    message = config_error(["sweep.workers_per_trial=8"])
    assert "sweep.workers_per_trial=8" in message
    assert "ray.num_cpus" in message


def test_relative_storage_root():
    message = config_error(["storage.root=out/storage"])
    assert "storage.root" in message
    assert "relative" in message
    assert "absolute path or an s3://" in message


@pytest.mark.parametrize("root", ["/abs/storage", "s3://bucket/prefix"])
def test_absolute_or_s3_storage_root(root):
    assert load_config(None, [f"storage.root={root}"]).storage.root == root


@pytest.mark.parametrize("low", ["0", "-1.0e-3"])
def test_search_space_loguniform_low_not_positive(low):
    message = config_error([f"sweep.search_space={{train.lr: {{loguniform: [{low}, 0.1]}}}}"])
    assert "sweep.search_space.train.lr" in message
    assert "0 < low < high" in message


def test_search_space_domain_needs_exactly_one_kind():
    message = config_error(
        ["sweep.search_space={train.lr: {loguniform: [0.001, 0.1], uniform: [0.001, 0.1]}}"]
    )
    assert "sweep.search_space.train.lr" in message
    assert "exactly one of loguniform, uniform, choice, randint" in message


def test_search_space_key_that_is_not_a_config_path():
    message = config_error(["sweep.search_space={train.learning_rate: {choice: [0.1]}}"])
    assert "'train.learning_rate'" in message
    assert "is not a config key" in message
    assert "train.lr" in message  # an example of a valid path


def test_search_space_key_outside_train_and_model():
    message = config_error(["sweep.search_space={ray.num_cpus: {choice: [2, 4]}}"])
    assert "'ray.num_cpus'" in message
    assert "only train.* and model.*" in message


def test_search_space_choice_with_an_invalid_value():
    message = config_error(["sweep.search_space={train.batch_size: {choice: [0, 32]}}"])
    assert "sweep.search_space['train.batch_size']" in message
    assert "can produce 0" in message
    assert "greater than or equal to 1" in message


def test_search_space_randint_upper_edge_is_checked():
    # randint's high is exclusive: [0, 2) on dropout yields 0 and 1; dropout must be < 1.
    message = config_error(["sweep.search_space={model.dropout: {randint: [0, 2]}}"])
    assert "sweep.search_space['model.dropout']" in message
    assert "can produce 1" in message


def test_search_space_continuous_domain_on_an_int_key():
    message = config_error(["sweep.search_space={train.batch_size: {uniform: [16, 128]}}"])
    assert "sweep.search_space['train.batch_size']" in message
    assert "integer" in message


def test_split_fractions_sum_too_high():
    message = config_error(["data.split.val=0.5", "data.split.test=0.45"])
    assert "data.split" in message
    assert "0.95" in message
    assert "below 0.9" in message


def test_split_fraction_out_of_range():
    message = config_error(["data.split.val=1.5"])
    assert "data.split.val" in message
    assert "less than 1" in message


def test_nccl_without_gpu():
    message = config_error(["train.backend=nccl"])
    assert "train.backend=nccl" in message
    assert "train.use_gpu=true" in message
    assert "gloo" in message


def test_nccl_with_gpu_is_valid():
    config = load_config(None, ["train.backend=nccl", "train.use_gpu=true"])
    assert config.train.backend == "nccl"


def test_features_and_image_column_are_exclusive():
    message = config_error(["data.feature_columns=[a, b]", "data.image_column=pixels"])
    assert "data.feature_columns" in message and "data.image_column" in message


def test_every_bad_key_is_reported_at_once():
    message = config_error(["train.lr=-1", "train.batch_size=0"])
    assert "train.lr" in message and "train.batch_size" in message


def test_config_error_is_a_trainflow_error_that_is_not_retried():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.lr=-1"])
    assert isinstance(info.value, TrainflowError)
    assert info.value.retriable is False


# --- config files -----------------------------------------------------------------------------


def test_config_file_missing(tmp_path):
    missing = tmp_path / "nope.yaml"
    message = config_error([], missing)
    assert str(missing) in message
    assert "does not exist" in message


@pytest.mark.parametrize("text", ["- train\n- sweep\n", "just a string\n", "42\n"])
def test_config_file_not_a_mapping(tmp_path, text):
    path = tmp_path / "list.yaml"
    path.write_text(text)
    message = config_error([], path)
    assert str(path) in message
    assert "mapping" in message


def test_config_file_not_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("train: {lr: [1, 2\n")
    message = config_error([], path)
    assert str(path) in message
    assert "not valid YAML" in message


def test_empty_config_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing but a comment\n")
    assert load_config(path) == load_config()


# --- with_overrides and flat ------------------------------------------------------------------


def test_with_overrides_returns_a_validated_copy():
    original = load_config()
    before = original.model_dump()
    changed = original.with_overrides({"train.lr": 0.02, "model.dropout": 0.2})
    assert changed is not original
    assert changed.train.lr == pytest.approx(0.02)
    assert changed.model.dropout == pytest.approx(0.2)
    assert original.model_dump() == before
    assert original.train.lr == pytest.approx(3e-3)


def test_with_overrides_validates():
    original = load_config()
    with pytest.raises(ConfigError) as info:
        original.with_overrides({"train.batch_size": 0})
    assert "train.batch_size" in str(info.value)
    with pytest.raises(ConfigError) as info:
        original.with_overrides({"train.lrr": 0.1})
    assert "train.lrr" in str(info.value)
    assert original.train.batch_size == 64


def test_with_overrides_keeps_elastic_workers():
    config = load_config(None, ["train.num_workers=[1,2]"]).with_overrides({"train.lr": 0.01})
    assert config.train.num_workers == (1, 2)


def test_flat_keys_are_dotted():
    flat = load_config().flat()
    assert all("." in key for key in flat)
    assert flat["train.lr"] == pytest.approx(3e-3)
    assert flat["sweep.asha.max_t"] == 10
    assert flat["data.split.val"] == pytest.approx(0.15)
    assert flat["mlflow.registered_model"] is None  # named after the data: see below
    assert not any(isinstance(value, dict) and value for value in flat.values())


# --- model.kind=cnn needs an image shape ------------------------------------------------------


def test_cnn_on_builtin_digits_fills_image_shape():
    config = load_config(None, ["model.kind=cnn"])
    assert config.data.source == BUILTIN_DIGITS
    assert config.data.image_shape == DIGITS_IMAGE_SHAPE == [1, 8, 8]


def test_cnn_on_a_user_table_without_image_shape():
    message = config_error(["model.kind=cnn", "data.source=/data/table.parquet"])
    assert "model.kind=cnn" in message
    assert "data.image_shape" in message


def test_cnn_on_a_user_table_with_image_shape():
    config = load_config(
        None,
        [
            "model.kind=cnn",
            "data.source=/data/table.parquet",
            "data.image_column=pixels",
            "data.image_shape=[1, 28, 28]",
        ],
    )
    assert config.data.image_shape == [1, 28, 28]


def test_image_shape_must_be_three_positive_ints():
    message = config_error(["data.image_shape=[8, 8]"])
    assert "data.image_shape" in message
    assert "three positive ints" in message
