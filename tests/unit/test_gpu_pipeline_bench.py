"""The GPU pipeline benchmark's reading of a run log: epoch stamps and the steady training rate.

Fast and without Ray or a GPU: the log lines are the ones `trainflow.progress` writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.gpu_pipeline import epoch_seconds, steady_rows_per_s  # noqa: E402

LOG = """\
2026-11-25 23:01:58,100 INFO trainflow.progress: sweep: 8/8 trials done
(RayTrainWorker pid=1136) Reporting training result 1: TrainingReport(metrics={'epoch': 1})
2026-11-25 23:01:58,553 INFO trainflow.progress: train: epoch 1/3, val_accuracy 0.9191
23:01:58.553 | INFO    | trainflow.progress - train: epoch 1/3, val_accuracy 0.9191
2026-11-25 23:01:59,053 INFO trainflow.progress: train: epoch 2/3, val_accuracy 0.9412
2026-11-25 23:01:59,553 INFO trainflow.progress: train: epoch 3/3, val_accuracy 0.9632
"""


def test_only_the_final_trainings_epoch_lines_are_read_once_each():
    stamps = epoch_seconds(LOG)
    assert [epoch for epoch, _ in stamps] == [1, 2, 3]
    assert round(stamps[-1][1] - stamps[0][1], 3) == 1.0


def test_steady_rate_leaves_out_start_up_and_the_first_epoch():
    # Two epochs of 1,000 rows between the first and the last line, one second apart.
    assert steady_rows_per_s(epoch_seconds(LOG), 1000) == 2000


def test_no_rate_without_two_epochs():
    assert steady_rows_per_s(epoch_seconds(LOG.splitlines()[2]), 1000) is None
    assert steady_rows_per_s([], 1000) is None
