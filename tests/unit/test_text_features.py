"""Free text as a feature: a text column is a used role (inferred or
declared), and the transform's ``text`` step hashes it into a bag of word and character n-grams:
deterministic in any process, importable with numpy and pandas alone, one clear error for values
that are not text."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from test_layout import REPO_ROOT, SHIPPED, SUBPROCESS_TIMEOUT_S, clean_env

from training.data.roles import role_line
from training.model.trainflow_pyfunc.text_features import hashed_block, hashed_text
from training.model.trainflow_pyfunc.transform import position_names, raw_matrix
from training.model.trainflow_pyfunc.transform_steps import TransformError

TEXTS = [
    "The Chancellor said growth would slow.",
    "Arsenal beat Chelsea 2-1 at Highbury",
    "",
    "the chancellor SAID growth would slow.",
    "growth would slow, the Chancellor said",
]


def _digest(block: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(block, dtype=np.float64).tobytes()).hexdigest()


def test_rows_are_unit_length_signed_and_sparse():
    block = hashed_block(np.array(TEXTS, dtype=object), 256)
    assert block.shape == (5, 256)
    norms = np.linalg.norm(block, axis=1)
    np.testing.assert_allclose(norms[[0, 1, 3, 4]], 1.0, rtol=1e-12)
    assert norms[2] == 0  # no words: a row of zeros, not NaN
    assert (block < 0).any() and (block > 0).any()  # signed hashing
    assert (block[0] != 0).sum() < 128  # a short text touches few buckets


def test_case_does_not_matter_and_word_order_does_through_bigrams():
    block = hashed_block(np.array(TEXTS, dtype=object), 2**16)
    np.testing.assert_array_equal(block[0], block[3])  # lowercased; punctuation is no word
    same_words = np.sign(block[0]) == np.sign(block[4])
    assert not np.array_equal(block[0], block[4])  # other bigrams
    assert same_words[block[0] != 0].mean() > 0.8  # the unigrams and char grams agree


def test_the_bucket_count_is_the_width_per_column():
    frame = pd.DataFrame({"a": TEXTS, "b": TEXTS[::-1]})
    spec = {"text_features": 64}
    out = hashed_text(frame, ["a", "b"], spec)
    assert out.shape == (5, 128)
    np.testing.assert_array_equal(out[:, 64:], out[::-1, :64])
    spec = {"text_columns": ["a", "b"], "text_features": 64, "feature_columns": []}
    assert raw_matrix(frame, spec).shape == (5, 128)
    assert position_names(spec) == ["a"] * 64 + ["b"] * 64


def test_missing_text_is_empty_text_in_every_string_dtype():
    import pyarrow as pa

    values = ["some words here", None]
    expected = hashed_text(pd.DataFrame({"t": ["some words here", ""]}), ["t"], {})
    for dtype in (object, "string", pd.ArrowDtype(pa.string())):
        frame = pd.DataFrame({"t": pd.Series(values, dtype=dtype)})
        np.testing.assert_array_equal(hashed_text(frame, ["t"], {}), expected)


@pytest.mark.parametrize(
    ("values", "example"),
    [([1.5, 2.0], "1.5"), (["fine text", 7], "7"), ([b"bytes", "text"], "b'bytes'")],
)
def test_a_value_that_is_not_text_is_one_error_naming_the_column(values, example):
    frame = pd.DataFrame({"review": pd.Series(values, dtype=object)})
    with pytest.raises(TransformError, match=rf"text column 'review' .*\(e.g. {example}"):
        hashed_text(frame, ["review"], {})


def test_the_hashing_is_the_same_in_a_bare_process_with_another_hash_seed(tmp_path):
    """The shipped package alone (no trainflow, no torch imported by the step), a different
    PYTHONHASHSEED: the same numbers, so a served model sees what training saw."""
    shutil.copytree(
        REPO_ROOT / SHIPPED.replace(".", "/"),
        tmp_path / "trainflow_pyfunc",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    expected = _digest(hashed_block(np.array(TEXTS, dtype=object), 512))
    code = f"""
        import hashlib, json, sys
        import numpy as np
        from trainflow_pyfunc.text_features import hashed_block
        block = hashed_block(np.array({TEXTS!r}, dtype=object), 512)
        digest = hashlib.sha256(np.ascontiguousarray(block).tobytes()).hexdigest()
        heavy = {{"torch", "mlflow", "training", "ray"}}
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & heavy)
        print(json.dumps([digest, loaded]))
    """
    env = {k: v for k, v in clean_env(PYTHONHASHSEED="12345").items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    digest, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert digest == expected
    assert loaded == []
    assert os.environ.get("PYTHONHASHSEED") != "12345"


def test_the_preprocess_line_counts_text_as_used():
    roles = {"size": "numeric", "note": "text", "order_id": "id-like"}
    assert role_line(roles) == "1 numeric (size), 1 text (note), 1 id-like ignored (order_id)"


#: Which buckets (signed) one sentence fills at 64 buckets, as trained models have it: a pandas
#: or numpy upgrade that changed the hashing would serve old models other numbers.
PINNED = [0, 1, -2, -4, -6, 7, 10, -13, -14, 15, -16, -18, -23, -24, 25, 26, -27, -28, -30]
PINNED += [-32, 33, -34, 35, 36, 38, -40, 41, -42, 45, 46, 48, -50, 52, 54, 56, -57, 59, -60, 63]


def test_the_hashing_is_pinned_across_versions():
    row = hashed_block(np.array([TEXTS[0]], dtype=object), 64)[0]
    cells = np.flatnonzero(row)
    assert [int(i) if row[i] > 0 else -int(i) for i in cells] == PINNED
    assert sorted({round(abs(float(v)), 6) for v in row[cells]}) == [0.132062, 0.223601, 0.277147]
