"""training.report writes real PNG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training.report import confusion_matrix_png, learning_curves_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 1000) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes


def test_confusion_matrix_png(tmp_path):
    matrix = np.diag([10] * 10) + 1
    out = confusion_matrix_png(matrix, [str(i) for i in range(10)], str(tmp_path / "a" / "cm.png"))
    assert out == str(tmp_path / "a" / "cm.png")
    assert_png(out)


def test_confusion_matrix_from_lists(tmp_path):
    out = confusion_matrix_png([[5, 1], [2, 7]], ["cat", "dog"], str(tmp_path / "cm.png"))
    assert_png(out)


def test_confusion_matrix_shape_mismatch(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        confusion_matrix_png([[1, 2], [3, 4]], ["a", "b", "c"], str(tmp_path / "bad.png"))
    assert not (tmp_path / "bad.png").exists()


def test_learning_curves_png(tmp_path):
    history = [
        {"epoch": e, "train_loss": 1 / e, "val_loss": 1.2 / e, "val_accuracy": 1 - 0.5 / e}
        for e in range(1, 6)
    ]
    history[2]["val_loss"] = float("nan")  # skipped, not plotted
    out = learning_curves_png(history, str(tmp_path / "curves.png"))
    assert_png(out)


def test_learning_curves_empty_history(tmp_path):
    assert_png(learning_curves_png([], str(tmp_path / "empty.png")), min_bytes=100)
