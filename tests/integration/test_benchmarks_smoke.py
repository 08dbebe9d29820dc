"""A seconds-scale smoke of the benchmark harness, as CI runs it: B2 and B6 with ``--smoke``,
B11 (a causal LM's throughput) at its toy size, and B12 (user code per epoch) with ``--smoke``.

Not a timed test of the pipeline: the numbers are not checked, only that the suite runs end to
end (child processes, Ray, alternation, JSON, docs table) quickly and writes valid results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import doc_tables as dt  # noqa: E402
from benchmarks import result_files as rf  # noqa: E402

pytestmark = pytest.mark.integration


def _smoke(only: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """``python -m benchmarks --smoke --only ONLY ARGS`` with no trainflow/MLflow/Prefect/Ray
    settings of the caller's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINFLOW_", "MLFLOW_", "PREFECT_", "RAY_ADDRESS"))
    }
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", only, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_smoke_b2_b6_writes_valid_json_and_a_table(tmp_path):
    out, docs = tmp_path / "results", tmp_path / "benchmarks.md"
    started = time.monotonic()
    proc = _smoke("B2,B6", "--out", str(out), "--docs", str(docs), timeout=300)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # Not a timed test (the machine is noisy): the duration is only reported.
    print(f"B2,B6 smoke took {elapsed:.0f} s")

    for bench_id in ("B2", "B6"):
        doc = json.loads((out / f"{bench_id}.json").read_text())
        assert rf.validate_result(doc) == [], doc
        assert doc["status"] == "ok" and doc["smoke"] is True
        assert doc["machine"]["nproc"] >= 1 and doc["machine"]["cpu_model"]
        measured = [f for f in doc["figures"] if f["stats"]["n"] > 0]
        assert measured, f"{bench_id} measured nothing"
        assert all(f["value"] > 0 for f in measured), doc["figures"]
        assert doc["samples"] and doc["params"]
    b2 = json.loads((out / "B2.json").read_text())
    # Alternation: two repetitions of each preprocessing arm, in A B A B order.
    assert [len(b2["samples"][arm]) for arm in ("ray_x1", "arrow_x1")] == [2, 2]
    b6 = json.loads((out / "B6.json").read_text())
    assert all(s["errored"] == 0 for s in b6["samples"]["sweep"])

    table = docs.read_text()
    assert dt.TABLE_START in table and dt.TABLE_END in table
    assert "[smoke]" in table  # smoke results are shown only because --docs was given
    assert f"B2 ({b2['duration_s']:.0f} s)" in proc.stdout


def test_smoke_b11_measures_ddp_fsdp_and_the_bare_loop_at_toy_size(tmp_path):

    out = tmp_path / "results"
    proc = _smoke("B11", "--size", "toy", "--out", str(out), "--no-docs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    doc = json.loads((out / "B11.json").read_text())
    assert rf.validate_result(doc) == [], doc
    assert doc["status"] == "ok" and doc["smoke"] is True and doc["params"]["size"] == "toy"
    figures = {f["key"]: f for f in doc["figures"]}
    for arm in ("ddp", "fsdp"):
        assert figures[f"ratio_{arm}"]["value"] > 0, figures
        assert figures[f"mfu_{arm}"]["value"] > 0, figures
        (sample,) = doc["samples"][arm]
        assert sample["world_size"] == 2 and sample["tokens_per_s"] > 0
    # said, not measured: the smoke leaves ZeRO-3 to tests/integration/test_deepspeed.py
    assert figures["ratio_deepspeed"]["value"] is None
    assert figures["ratio_deepspeed"]["note"] == doc["extra"]["deepspeed"]
    assert doc["extra"]["deepspeed"].startswith("skipped in the smoke")
    assert figures["tps_bare"]["value"] > 0 and figures["mfu_bare"]["value"] > 0
    assert doc["extra"]["flops_per_token"] > 6 * doc["extra"]["params_counted"]


@pytest.mark.slow  # four TorchTrainer fits: ~2 min on 2 cores, start-up most of it
def test_smoke_b12_times_both_engines_against_a_bare_torch_trainer(tmp_path):
    out = tmp_path / "results"
    started = time.monotonic()
    proc = _smoke("B12", "--out", str(out), "--no-docs", timeout=420)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    print(f"B12 smoke took {elapsed:.0f} s")  # reported, not asserted: the machine is noisy
    doc = json.loads((out / "B12.json").read_text())
    assert rf.validate_result(doc) == [], doc
    assert doc["status"] == "ok" and doc["smoke"] is True
    figures = {f["key"]: f for f in doc["figures"]}
    for engine in ("function", "lightning"):
        assert figures[f"ratio_{engine}"]["value"] > 0, figures
        for arm in ("trainflow", "bare"):
            (sample,) = doc["samples"][f"{arm}_{engine}"]
            assert sample["epochs"] == doc["params"]["epochs"] and sample["samples_per_s"] > 0
