"""The sweep's searcher and trial resources, built from config without a Ray cluster."""

from __future__ import annotations

import pytest

from training.config.overrides import load_config
from training.errors import ConfigError
from training.tune.resources import TRAINER_DRIVER_CPU, trial_resources

CPU_ONLY = {"CPU": 4.0, "memory": 8e9}
ONE_GPU = {"CPU": 16.0, "GPU": 1.0}


# -- trial resources ------------------------------------------------------------------------------


def test_cpu_trials_take_one_cpu_and_no_gpu():
    resources = trial_resources(load_config(None), CPU_ONLY)
    assert resources.trial == {"cpu": 1.0}
    assert resources.worker is None
    # A cluster's GPUs are not used without train.use_gpu.
    assert trial_resources(load_config(None), ONE_GPU).trial == {"cpu": 1.0}


def test_gpu_function_trials_share_a_gpu_by_the_configured_fraction():
    config = load_config(None, ["train.use_gpu=true", "sweep.gpus_per_trial=0.25"])
    assert trial_resources(config, ONE_GPU).trial == {"cpu": 1.0, "gpu": 0.25}


def test_gpu_function_trials_default_to_one_gpu_where_the_cluster_has_one():
    config = load_config(None, ["train.use_gpu=true"])
    assert trial_resources(config, ONE_GPU).trial == {"cpu": 1.0, "gpu": 1.0}


def test_gpu_trials_on_a_cluster_without_gpus_fail_before_any_trial_waits_forever():
    config = load_config(None, ["train.use_gpu=true"])
    with pytest.raises(ConfigError, match="no GPU.*4 CPU.*sweep.gpus_per_trial"):
        trial_resources(config, CPU_ONLY)
    # Said explicitly, it is used as is: an autoscaler may add GPU nodes for the trials.
    explicit = load_config(None, ["train.use_gpu=true", "sweep.gpus_per_trial=1"])
    assert trial_resources(explicit, CPU_ONLY).trial == {"cpu": 1.0, "gpu": 1.0}


def test_trainer_trials_give_each_worker_a_gpu_and_the_trial_a_sliver_of_cpu():
    config = load_config(None, ["train.use_gpu=true", "sweep.workers_per_trial=2"])
    resources = trial_resources(config, {"CPU": 16.0, "GPU": 2.0})
    assert resources.trial == {"cpu": TRAINER_DRIVER_CPU}
    assert resources.worker == {"CPU": 1.0, "GPU": 1.0}
    cpu = trial_resources(load_config(None, ["sweep.workers_per_trial=2"]), CPU_ONLY)
    assert (cpu.trial, cpu.worker) == ({"cpu": TRAINER_DRIVER_CPU}, {"CPU": 1.0})


# -- config validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["sweep.searcher=tpe"], r"sweep\.searcher: Input should be 'random' or 'optuna'"),
        (["train.use_gpu=true", "sweep.gpus_per_trial=0"], r"sweep\.gpus_per_trial: .*greater"),
        (["train.use_gpu=true", "sweep.gpus_per_trial=1.5"], r"sweep\.gpus_per_trial: .*share"),
        (["sweep.gpus_per_trial=0.5"], r"sweep\.gpus_per_trial needs train\.use_gpu=true"),
        (
            ["train.use_gpu=true", "sweep.gpus_per_trial=0.5", "sweep.workers_per_trial=2"],
            r"whole number",
        ),
    ],
)
def test_bad_searcher_or_gpu_share_is_a_config_error_naming_the_key(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets)


def test_whole_gpus_per_trial_are_allowed():
    config = load_config(None, ["train.use_gpu=true", "sweep.gpus_per_trial=2"])
    assert config.sweep.gpus_per_trial == 2
    assert load_config(None).sweep.searcher == "random"


# -- searchers ------------------------------------------------------------------------------------

SPACE = (
    "sweep.search_space={train.lr: {loguniform: [1.0e-4, 1.0e-1]}, "
    "model.dropout: {uniform: [0.0, 0.5]}, train.max_epochs: {randint: [2, 4]}, "
    "train.batch_size: {choice: [32, 64]}, model.hidden_sizes: {choice: [[32], [64, 32]]}}"
)


def _suggestions(sweep, n: int) -> list[dict]:
    from training.tune.space import param_space
    from training.tune.sweep import build_searcher

    searcher = build_searcher(sweep)
    assert searcher.set_search_properties(sweep.metric, sweep.mode, param_space(sweep))
    return [searcher.suggest(f"t{i}") for i in range(n)]


def test_optuna_takes_every_tune_domain_seeded_and_limited_to_the_concurrent_trials():
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from training.tune.sweep import build_searcher

    sweep = load_config(None, ["sweep.searcher=optuna", "sweep.max_concurrent_trials=2", SPACE])
    searcher = build_searcher(sweep.sweep)
    assert isinstance(searcher, ConcurrencyLimiter) and searcher.max_concurrent == 2
    assert isinstance(searcher.searcher, OptunaSearch)
    first = _suggestions(sweep.sweep, 3)
    # The third waits: two trials are running (none has completed).
    assert first[2] is None
    for params in first[:2]:
        assert set(params) == set(sweep.sweep.search_space)
        assert 1e-4 <= params["train.lr"] <= 1e-1
        assert 0.0 <= params["model.dropout"] <= 0.5
        assert params["train.max_epochs"] in (2, 3)  # randint's high end is exclusive
        assert params["train.batch_size"] in (32, 64)
        assert params["model.hidden_sizes"] in ([32], [64, 32])
    # Seeded with sweep.seed: the same suggestions again; another seed, others.
    assert _suggestions(sweep.sweep, 2) == first[:2]
    other = load_config(None, ["sweep.searcher=optuna", "sweep.seed=7", SPACE])
    assert _suggestions(other.sweep, 2) != first[:2]


def test_random_search_stays_tunes_seeded_variant_generator():
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from training.tune.sweep import build_searcher

    config = load_config(None, ["sweep.max_concurrent_trials=3"])
    searcher = build_searcher(config.sweep)
    assert isinstance(searcher, BasicVariantGenerator)
    assert searcher.max_concurrent == 3
