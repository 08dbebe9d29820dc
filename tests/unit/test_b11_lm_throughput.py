"""B11's pieces: the FLOPs-per-token formula and the parameters it counts, the peaks MFU is
measured against, the steady tokens/s, the sizes and the DeepSpeed row's honest reasons."""

from __future__ import annotations

import pytest

from benchmarks import b11_bare_loop as bare
from benchmarks import b11_lm_throughput as b11
from benchmarks import b11_mfu as mfu


def test_flops_per_token_is_six_n_plus_the_attention_term():
    # GPT-2 small's shape at 1,024 tokens: 6 x 124M + 12 x 12 x 768 x 1024
    assert mfu.flops_per_token(124_000_000, 12, 768, 1024) == 6 * 124e6 + 12 * 12 * 768 * 1024
    with pytest.raises(ValueError, match="positive"):
        mfu.flops_per_token(0, 12, 768, 1024)


def test_counted_params_leave_out_position_embeddings_and_count_tied_weights_once():
    model = bare.bare_model(b11.SIZES["toy"], pad_id=0)
    total = sum(p.numel() for p in model.parameters())  # torch counts a tied tensor once
    gpt2 = b11.SIZES["toy"]["gpt2"]
    assert mfu.counted_params(model) == total - gpt2["n_positions"] * gpt2["n_embd"]
    assert model.lm_head.weight is model.transformer.wte.weight


def test_the_gpu_size_is_gpt2_small_about_124m_parameters():
    from transformers import AutoConfig

    config = AutoConfig.for_model("gpt2", **b11.SIZES["gpu"]["gpt2"])
    d, layers = config.n_embd, config.n_layer
    per_layer = 12 * d * d + 13 * d  # attention and MLP weights, biases, two layer norms
    params = layers * per_layer + config.vocab_size * d + config.n_positions * d + 2 * d
    assert 120e6 < params < 130e6
    assert b11.SIZES["gpu"]["precision"] == "bf16"


def test_peaks_by_device_name_and_mfu_is_none_without_one():
    assert mfu.gpu_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert mfu.gpu_peak("NVIDIA H200") == 989e12
    assert mfu.gpu_peak("NVIDIA A100-SXM4-40GB") == 312e12
    assert mfu.gpu_peak("Tesla T4") is None
    assert mfu.mfu(1000.0, 1e9, 1e13) == pytest.approx(0.1)
    assert mfu.mfu(1000.0, 1e9, None) is None


def test_the_cpu_peak_is_measured_and_plausible():
    peak = mfu.matmul_peak(threads=1, size=128, seconds=0.2)
    assert 1e8 < peak < 1e13  # a core does between 0.1 GFLOP/s (loaded) and 10 TFLOP/s


def test_steady_tokens_per_s_leaves_the_first_epoch_out_and_scales_by_ranks():
    assert bare.steady_tokens_per_s([999, 100, 300], [50.0, 1.0, 3.0]) == pytest.approx(100.0)
    assert bare.steady_tokens_per_s([1, 100], [9.0, 2.0], scale=2) == pytest.approx(100.0)
    with pytest.raises(RuntimeError, match="at least 2"):
        bare.steady_tokens_per_s([100], [1.0])


def test_the_size_is_chosen_by_the_device_or_the_environment(monkeypatch):
    monkeypatch.delenv(b11.SIZE_ENV, raising=False)
    assert b11.size_name(gpu=False) == "toy" and b11.size_name(gpu=True) == "gpu"
    monkeypatch.setenv(b11.SIZE_ENV, "gpu")
    assert b11.size_name(gpu=False) == "gpu"
    monkeypatch.setenv(b11.SIZE_ENV, "huge")
    with pytest.raises(ValueError, match="choose from toy, gpu"):
        b11.size_name(gpu=False)


def test_deepspeed_runs_where_its_extra_is_installed_and_says_so_where_not(monkeypatch):
    monkeypatch.setattr(b11.importlib.util, "find_spec", lambda name: object())
    assert b11.deepspeed_status() is None
    assert b11.deepspeed_status(smoke=True) == b11.DEEPSPEED_SMOKE
    monkeypatch.setattr(b11.importlib.util, "find_spec", lambda name: None)
    assert b11.deepspeed_status() == b11.DEEPSPEED_SKIPPED


def test_figures_compare_per_worker_say_why_deepspeed_is_empty_and_give_mfu_in_percent():
    samples = {
        # 2 workers: compared per worker with the bare loop on one device
        "ddp": [{"tokens_per_s": 180.0, "tokens_per_s_per_worker": 90.0}],
        "fsdp": [{"tokens_per_s": 160.0, "tokens_per_s_per_worker": 80.0}],
        "one_worker": [{"tokens_per_s": 95.0, "tokens_per_s_per_worker": 95.0}],
        "bare": [{"tokens_per_s": 100.0}],
    }
    flops = {"flops_per_token": 1e6, "peak_flops": 1e9, "peak_basis": "measured"}
    figures = {f.key: f.to_dict() for f in b11._figures(samples, flops, b11.DEEPSPEED_SKIPPED)}
    assert figures["ratio_ddp"]["value"] == pytest.approx(0.9) and figures["ratio_ddp"]["pass"]
    assert figures["ratio_fsdp"]["pass"] is False
    assert figures["ratio_one_worker"]["value"] == pytest.approx(0.95)
    assert figures["ratio_deepspeed"]["value"] is None
    assert figures["ratio_deepspeed"]["note"] == b11.DEEPSPEED_SKIPPED
    assert figures["ratio_deepspeed"]["target"] is None  # no goal for a row that did not run
    assert figures["mfu_bare"]["value"] == pytest.approx(10.0)  # 100 x 1e6 / 1e9 = 10 %
    assert figures["mfu_ddp"]["value"] == pytest.approx(9.0)  # per worker, against one device
    assert {s.key for s in b11.FIGURES} == set(figures)


def test_the_cli_passes_size_to_b11s_child_by_its_environment_variable():
    from benchmarks import __main__ as cli

    assert cli.B11_SIZE_ENV == b11.SIZE_ENV
    assert cli._parse(["--only", "B11", "--size", "gpu"]).size == "gpu"
    assert cli._parse([]).size is None
    with pytest.raises(SystemExit):
        cli._parse(["--size", "huge"])
