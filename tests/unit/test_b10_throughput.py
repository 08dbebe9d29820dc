"""B10's throughput half: steady state excludes the first epoch; the model size is a parameter."""

from __future__ import annotations

import pytest

from benchmarks import b10_hf_throughput as b10


def test_steady_tokens_per_s_leaves_the_first_epoch_out():
    tps, seconds = b10._tokens_per_s([10.0, 14.0, 18.0], tokens_per_epoch=1000)
    assert seconds == 8.0 and tps == pytest.approx(2000 / 8.0)
    with pytest.raises(RuntimeError, match="at least 2 epochs"):
        b10._tokens_per_s([10.0], 1000)


def test_the_model_size_is_a_parameter(monkeypatch):
    monkeypatch.delenv(b10.SIZE_ENV, raising=False)
    assert b10._size(gpu=False) == "small" and b10._size(gpu=True) == "base"
    monkeypatch.setenv(b10.SIZE_ENV, "base")
    assert b10._size(gpu=False) == "base"
    monkeypatch.setenv(b10.SIZE_ENV, "huge")
    with pytest.raises(ValueError, match="choose from small, base"):
        b10._size(gpu=False)


def test_the_gpu_size_is_about_100m_parameters():
    base = b10.SIZES["base"]
    hidden, layers, inner = base["hidden_size"], base["num_hidden_layers"], 3072
    per_layer = 4 * hidden * hidden + 2 * hidden * inner
    assert 80e6 < layers * per_layer + 8000 * hidden < 120e6
