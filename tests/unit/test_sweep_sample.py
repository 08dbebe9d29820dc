"""How many rows the sweep's function trials hold: sweep.sample_rows, bounded by sweep.sample_mb."""

from __future__ import annotations

from types import SimpleNamespace

from training.config import SweepConfig
from training.manifest import FeatureSpec
from training.tune.sweep import sample_sizes


def _manifest(train: int, val: int, shape: list[int]):
    spec = FeatureSpec("label", [0, 1], shape, [0.0], [1.0])
    return SimpleNamespace(rows={"train": train, "val": val, "test": val}, spec=spec)


def test_a_table_is_sampled_by_rows():
    sizes = sample_sizes(SweepConfig(), _manifest(7_000_000, 1_500_000, [64]))
    assert sizes == {"train": 200_000, "val": 42_858}  # val in proportion, rounded up


def test_wide_rows_are_sampled_by_memory():
    # 3x32x32 float32 images: 12,304 bytes a row; 256 MiB hold 21,816 of them.
    sizes = sample_sizes(SweepConfig(), _manifest(140_000, 30_000, [3, 32, 32]))
    assert sizes["train"] == 256 * 1024**2 // (4 * 3 * 32 * 32 + 16) == 21_816
    assert sizes["val"] == 4675
    # Without the memory bound, the row count alone decides (here: the whole split).
    unbounded = sample_sizes(SweepConfig(sample_mb=None), _manifest(140_000, 30_000, [3, 32, 32]))
    assert unbounded == {"train": 140_000, "val": 30_000}


def test_small_splits_are_whole():
    assert sample_sizes(SweepConfig(), _manifest(1257, 270, [64])) == {"train": 1257, "val": 270}
