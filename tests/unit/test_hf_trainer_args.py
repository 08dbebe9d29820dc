"""``train.engine: hf_trainer``: trainflow's keys mapped to TrainingArguments, the user's
``train.hf_args`` on top, and the arguments that fight trainflow refused at validation."""

from __future__ import annotations

import pytest
from hf_fixtures import hf_model_config

from training.config import validate_config
from training.errors import ConfigError
from training.loop.hf_arguments import engine_plan, training_arguments


def _config(**train):
    model = hf_model_config()
    return validate_config({"model": model, "train": {"engine": "hf_trainer", **train}})


def test_trainflows_keys_map_to_training_arguments():
    train = _config(
        lr=0.01, batch_size=32, max_epochs=4, weight_decay=0.2, warmup_ratio=0.1, seed=7
    ).train
    plan = engine_plan(train, train_rows=101, world_size=2, epochs=4)
    args = training_arguments(train, plan, "/scratch")
    assert args["learning_rate"] == 0.01 and args["weight_decay"] == 0.2 and args["seed"] == 7
    assert args["per_device_train_batch_size"] == 16  # the global batch split across workers
    assert args["num_train_epochs"] == 4
    assert args["max_steps"] == 4 * 4  # 50 rows per worker's shard: 4 batches of 16 an epoch
    assert args["warmup_steps"] == pytest.approx(0.1)  # a ratio of max_steps
    assert args["lr_scheduler_type"] == "cosine" and args["bf16"] is False
    assert args["report_to"] == "none" and args["output_dir"] == "/scratch"
    assert args["eval_strategy"] == args["save_strategy"] == args["logging_strategy"] == "epoch"


def test_bf16_and_a_constant_schedule_map_too():
    train = _config(precision="bf16", lr_schedule="constant", warmup_ratio=0.2).train
    args = training_arguments(train, engine_plan(train, 64, 1, 1), "/x")
    assert args["bf16"] is True and args["lr_scheduler_type"] == "constant_with_warmup"
    assert args["per_device_train_batch_size"] == 64 and args["max_steps"] == 1


def test_hf_args_set_what_trainflow_does_not():
    train = _config(hf_args={"max_grad_norm": 0.5, "optim": "adamw_torch", "report_to": "none"})
    args = training_arguments(train.train, engine_plan(train.train, 64, 1, 1), "/x")
    assert args["max_grad_norm"] == 0.5 and args["optim"] == "adamw_torch"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("deepspeed", "ds.json", "Ray Train handles distribution"),
        ("fsdp", "full_shard", "Ray Train handles distribution"),
        ("local_rank", 0, "Ray Train handles distribution"),
        ("output_dir", "/elsewhere", "under the run's storage"),
        ("report_to", "wandb", "only 'none'"),
        ("learning_rate", 0.1, "set train.lr instead"),
        ("num_train_epochs", 3, "set train.max_epochs instead"),
        ("max_steps", 10, "computes it from the train split's rows"),
        ("no_such_argument", 1, "not a transformers.TrainingArguments field"),
    ],
)
def test_arguments_that_fight_trainflow_are_one_config_error(key, value, why):
    with pytest.raises(ConfigError) as error:
        _config(hf_args={key: value})
    message = str(error.value)
    assert f"train.hf_args: {key}" in message and why in message, message


def test_every_refused_argument_is_named_in_one_error():
    with pytest.raises(ConfigError) as error:
        _config(hf_args={"deepspeed": "ds.json", "report_to": ["wandb"], "seed": 1})
    message = str(error.value)
    assert "deepspeed:" in message and "report_to=" in message and "seed:" in message


def test_the_engine_needs_a_hugging_face_model():
    with pytest.raises(ConfigError, match="needs model.kind=hf"):
        validate_config({"train": {"engine": "hf_trainer"}})


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"strategy": "fsdp"}, "train.strategy=fsdp is the loop's"),
        ({"checkpoint": {"every_n_batches": 5}}, "every_n_batches is the loop's"),
    ],
)
def test_the_loops_own_options_are_refused_with_the_engine(train, message):
    with pytest.raises(ConfigError, match=message):
        _config(**train)


def test_a_causal_language_model_trains_with_the_loop():
    with pytest.raises(ConfigError, match="causal_lm model trains with train.engine=loop"):
        validate_config(
            {
                "data": {"task": "causal_lm", "source": "builtin:bbc_news"},
                "model": hf_model_config(),
                "train": {"engine": "hf_trainer"},
            }
        )


def test_hf_args_need_the_engine():
    with pytest.raises(ConfigError, match="train.hf_args goes with train.engine=hf_trainer"):
        validate_config({"model": hf_model_config(), "train": {"hf_args": {"max_grad_norm": 1}}})


def test_the_loop_stays_the_default():
    assert validate_config({}).train.engine == "loop"


def test_an_epochs_trainer_logs_take_the_loops_names():
    from training.loop.hf_trainer import epoch_metrics

    logs = [
        {"loss": 0.9, "learning_rate": 0.001, "epoch": 1.0, "step": 4},
        {"eval_loss": 0.7, "eval_accuracy": 0.6, "eval_runtime": 0.1, "step": 4},
        {"eval_samples_per_second": 30.0, "eval_steps_per_second": 3.0},
    ]
    metrics = epoch_metrics(logs, epoch=2, world_size=2)
    assert metrics["epoch"] == 2 and metrics["train_loss"] == 0.9 and metrics["lr"] == 0.001
    assert metrics["val_loss"] == 0.7 and metrics["val_accuracy"] == 0.6
    assert metrics["workers"] == 2.0
    assert not [key for key in metrics if "runtime" in key or "per_second" in key]


def test_the_trainer_model_returns_the_loops_mean_loss():
    import torch
    from torch import nn

    from training.loop.hf_trainer import TrainerModel

    network = nn.Linear(3, 2)
    features, labels = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    out = TrainerModel(network, regression=False)(features=features, labels=labels)
    expected = nn.functional.cross_entropy(network(features), labels)
    assert out["loss"].item() == pytest.approx(expected.item())
    assert "loss" not in TrainerModel(network, regression=False)(features=features)


def test_compute_metrics_gives_accuracy_over_the_gathered_predictions():
    from types import SimpleNamespace

    import numpy as np

    from training.loop.hf_trainer import compute_metrics_for

    spec = SimpleNamespace(is_regression=False)
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 5.0]])
    prediction = SimpleNamespace(predictions=logits, label_ids=np.array([0, 1, 1, 1]))
    assert compute_metrics_for(spec)(prediction) == {"accuracy": 0.75}
