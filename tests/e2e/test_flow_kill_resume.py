"""The flow process killed mid-run, then the same command resumed.

One run id through four `trainflow run` processes (smoke config), like Ray's
test_experiment_restore.py (kill the driver, restore, progress never goes back):

  1. SIGKILL mid-sweep (no handler runs: MLflow runs stay RUNNING, Tune state is on disk)
  2. `--resume`: preprocessing cached, sweep restored; SIGTERM once the final training has
     a checkpoint -> exit 143, runs KILLED, Ray shut down, no process of the run left
  3. `--resume`: SIGINT once the final training has another checkpoint -> exit 130, same checks
  4. `--resume`: finishes; the training continued from its checkpoint, every epoch once
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from flow_process import FlowProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
# The final training's epochs: room to stop it twice between checkpoints. An epoch of digits
# takes a fraction of a second, and a stop reaches the workers a few seconds after the signal
# (5 epochs later on a quiet machine).
EPOCHS = 50
ARGS = ("--config", SMOKE, "--set", f"train.max_epochs={EPOCHS}")
RUN_ID = "killme"
OTHER_ID = "alongside"  # case 10: a second run at the same time as the last resume
# A lighter run is enough to share the home, the data and the registry with the resume.
OTHER_ARGS = ("--config", SMOKE, "--set", "sweep.num_samples=2", "--run-id", OTHER_ID)
NUM_SAMPLES = 4  # configs/smoke.yaml


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kill-home")


def _sweep_dir(home: Path) -> Path:
    return home / "storage" / "runs" / RUN_ID / "sweep"


def _trials_reported(home: Path) -> dict[str, int]:
    """Trial directory -> rows in its result.json (one per reported epoch)."""
    sweep = _sweep_dir(home)
    if not sweep.is_dir():
        return {}
    return {
        p.parent.name: len(p.read_text().splitlines())
        for p in sweep.glob("*/result.json")
        if p.stat().st_size > 0
    }


def _furthest_by_trial_id(trials: dict[str, int]) -> dict[str, int]:
    """Trial id (``<trainable>_<experiment>_<index>``) -> most rows of any of its directories."""
    furthest: dict[str, int] = {}
    for directory, rows in trials.items():
        trial_id = "_".join(directory.split("_")[:5])  # _function_trial_579db_00002
        furthest[trial_id] = max(rows, furthest.get(trial_id, 0))
    return furthest


def _registered(home: Path) -> dict:
    """The final training's latest checkpoint that Ray Train registered (a checkpoint
    directory alone may never have been registered when the process died); {} if none."""
    snapshot = home / "storage" / "runs" / RUN_ID / "train" / "checkpoint_manager_snapshot.json"
    try:
        return json.loads(snapshot.read_text()).get("latest_checkpoint_result") or {}
    except (OSError, ValueError):
        return {}


def _registered_checkpoint(home: Path) -> str | None:
    return _registered(home).get("checkpoint_dir_name")


def _registered_epoch(home: Path) -> int | None:
    return _registered(home).get("metrics", {}).get("epoch")


def _mlflow(home: Path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainflow-smoke")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return client, runs


def _stop_facts(flow: FlowProcess, home: Path, code: int) -> dict:
    """What a stopped run left, read at once (the next resume changes it)."""
    _, runs = _mlflow(home)
    left = flow.wait_session_empty(timeout=30)  # Ray shut down, Prefect's server stopped
    flow.kill_session()
    return {
        "code": code,
        "out": " ".join(flow.output().split()),  # the CLI's message may wrap
        "running": [(r.info.run_name, r.info.status) for r in runs if r.info.status == "RUNNING"],
        "parent": next(r.info.status for r in runs if r.info.run_name == f"pipeline-{RUN_ID}"),
        "left": left,
    }


def _check_clean_stop(facts: dict, expected: int, word: str):
    out = facts["out"]
    assert facts["code"] == expected, out[-4000:]
    assert word in out and f"trainflow run --resume {RUN_ID}" in out, out[-3000:]
    assert facts["running"] == []
    assert facts["parent"] == "KILLED"
    # Ray shut down and nothing of the run left behind (raylet, GCS, workers, Prefect server).
    assert facts["left"] == {}, f"processes of the stopped run still alive: {facts['left']}"


@pytest.fixture(scope="module")
def sequence(home):
    """Runs the four processes once; each step's facts are returned for the tests below."""
    facts: dict = {}

    # 1. SIGKILL the flow process mid-sweep: Tune state saved, half the trials reported.
    flow = FlowProcess(home, *ARGS, "--run-id", RUN_ID)
    flow.wait_until(
        lambda: (
            any(_sweep_dir(home).glob("experiment_state-*.json"))
            and len(_trials_reported(home)) >= NUM_SAMPLES // 2
        )
    )
    facts["trials_at_kill"] = _trials_reported(home)
    os.kill(flow.proc.pid, signal.SIGKILL)
    flow.wait(timeout=60)
    # What a container runtime does next: nothing of the dead run may hold the CPUs.
    facts["left_after_sigkill"] = flow.wait_session_empty(timeout=10)
    flow.kill_session()
    _, runs = _mlflow(home)
    facts["running_after_sigkill"] = [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    facts["killed_s"] = flow.wall_s

    # 2. Resume; SIGTERM once the final training has registered a checkpoint.
    flow = FlowProcess(home, *ARGS, "--resume", RUN_ID)
    flow.wait_until(lambda: _registered_checkpoint(home) is not None)
    facts["trials_after_resume"] = _trials_reported(home)
    flow.proc.send_signal(signal.SIGTERM)
    facts["sigterm"] = _stop_facts(flow, home, flow.wait(timeout=120))
    facts["sigterm"]["epoch"] = _registered_epoch(home)
    facts["sigterm_out"] = flow.output()
    facts["sigterm_log"] = flow.run_log()

    # 3. Resume; SIGINT (Ctrl-C) as soon as the training continued from that checkpoint: when
    # Ray Train registered a later one. (A new checkpoint directory alone is not enough: under
    # load the SIGINT can come before Ray Train registers it, and the resume starts over from
    # the SIGTERM's checkpoint. The epochs leave room for the wait.)
    stopped_at = facts["sigterm"]["epoch"] or 0
    flow = FlowProcess(home, *ARGS, "--resume", RUN_ID)
    flow.wait_until(lambda: (_registered_epoch(home) or 0) > stopped_at)
    flow.proc.send_signal(signal.SIGINT)
    facts["sigint"] = _stop_facts(flow, home, flow.wait(timeout=120))
    facts["sigint"]["epoch"] = _registered_epoch(home)
    facts["sigint_log"] = flow.run_log()

    # 4. Resume to the end, while another run (case 10) runs at once in the same home.
    data_before = _checksums(home / "storage" / "data")
    summary, other_summary = home / "summary.json", home / "summary-other.json"
    flows = {
        RUN_ID: FlowProcess(home, *ARGS, "--resume", RUN_ID, "--summary-json", str(summary)),
        OTHER_ID: FlowProcess(home, *OTHER_ARGS, "--summary-json", str(other_summary)),
    }
    # Checksums of each run's files when it ends, and again once both ended.
    at_end: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + 900
    while len(at_end) < 2 and time.monotonic() < deadline:
        for run_id, flow in flows.items():
            if run_id not in at_end and flow.proc.poll() is not None:
                flow.wait()
                assert flow.proc.returncode == 0, flow.output()[-4000:]
                at_end[run_id] = _checksums(home / "storage" / "runs" / run_id)
        time.sleep(0.5)
    assert len(at_end) == 2, "the concurrent runs did not end in 15 min"
    facts["concurrent"] = {
        "at_end": at_end,
        "after_both": {r: _checksums(home / "storage" / "runs" / r) for r in flows},
        "data_before": data_before,
        "data_after": _checksums(home / "storage" / "data"),
        "other_summary": json.loads(other_summary.read_text()),
    }
    flow = flows[RUN_ID]
    facts["final_log"] = flow.run_log()
    facts["summary"] = json.loads(summary.read_text())
    facts["final_s"] = flow.wall_s
    print(f"case 3: killed part {facts['killed_s']:.1f} s, final resume {flow.wall_s:.1f} s")
    return facts


def _checksums(root: Path) -> dict[str, str]:
    import hashlib

    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_sigkill_mid_sweep_then_resume_restores_the_sweep(sequence):
    assert sequence["running_after_sigkill"], "SIGKILL left no RUNNING run: not killed mid-run?"
    before, after = sequence["trials_at_kill"], sequence["trials_after_resume"]
    # The same sweep, restored: the same trials (no new sweep of NUM_SAMPLES more), and no
    # trial's progress went back. Tune snapshots the sweep at most every 10 s ("auto"): a trial
    # that began after the last snapshot is run again under a new directory (seen in CI), so
    # trials are counted by id, each at its furthest directory.
    by_id_before, by_id_after = _furthest_by_trial_id(before), _furthest_by_trial_id(after)
    assert len(by_id_after) == NUM_SAMPLES, after
    assert set(by_id_before) <= set(by_id_after)
    assert all(by_id_after[t] >= rows for t, rows in by_id_before.items()), (before, after)
    # Preprocessing came from the cache, not recomputed (the flow's log lines: the run log).
    said = sequence["sigterm_out"] + sequence["sigterm_log"]
    assert "reused cached output, nothing recomputed" in said
    assert "left RUNNING by a killed process marked KILLED" in said


def test_sigterm_stops_cleanly(sequence):
    _check_clean_stop(sequence["sigterm"], 143, "terminated")
    # The training stopped with the run, not at its end: sent at the first checkpoint, the
    # SIGTERM once reached the workers only after all 80 epochs (Ray's wait for fit() drops
    # Prefect's TerminationSignal).
    assert sequence["sigterm"]["epoch"] < EPOCHS, sequence["sigterm"]


def test_sigint_stops_cleanly(sequence):
    _check_clean_stop(sequence["sigint"], 130, "interrupted")
    assert sequence["sigterm"]["epoch"] < sequence["sigint"]["epoch"] < EPOCHS, sequence
    # The training continued from the checkpoint the SIGTERMed process left.
    assert "trainflow: resuming at epoch" in sequence["sigint_log"]


def test_final_resume_finishes_from_the_checkpoint(sequence, home):
    summary = sequence["summary"]
    assert summary["run_id"] == RUN_ID
    assert summary["data"]["preprocess_cached"] is True
    assert "trainflow: resuming at epoch" in sequence["final_log"]
    client, runs = _mlflow(home)
    assert [r.info.run_id for r in runs if r.info.status == "RUNNING"] == []
    parents = [r for r in runs if r.data.tags.get("trainflow.stage") == "pipeline"]
    assert sorted((p.info.run_name, p.info.status) for p in parents) == [
        (f"pipeline-{OTHER_ID}", "FINISHED"),
        (f"pipeline-{RUN_ID}", "FINISHED"),
    ]
    # One train run, its metric steps continuous: every epoch exactly once over three processes.
    train = summary["mlflow"]["train_run_id"]
    steps = sorted(m.step for m in client.get_metric_history(train, "val_loss"))
    assert steps == list(range(1, EPOCHS + 1))
    assert [row["epoch"] for row in summary["sweep"]["trials"][0]["history"]] == list(
        range(1, summary["sweep"]["trials"][0]["epochs"] + 1)
    )
    # One model version per finished run: the killed processes registered nothing.
    versions = client.search_model_versions("name='digits-smoke'")
    other = sequence["concurrent"]["other_summary"]
    assert sorted(v.run_id for v in versions) == sorted([train, other["mlflow"]["train_run_id"]])


def test_concurrent_run_keeps_outputs_disjoint(sequence, home):
    """Case 10: two pipelines at once, different run ids, one trainflow home."""
    facts = sequence["concurrent"]
    mine, other = sequence["summary"], facts["other_summary"]
    assert other["run_id"] == OTHER_ID and other["storage"] != mine["storage"]
    # Neither run changed a byte of the other's files, nor of the shared preprocessed data.
    assert facts["at_end"] == facts["after_both"]
    assert all(facts["at_end"].values())
    assert facts["data_before"] and facts["data_before"] == facts["data_after"]
    assert other["data"]["fingerprint"] == mine["data"]["fingerprint"]
    # Separate MLflow run trees, each child tagged with its own run id.
    client, runs = _mlflow(home)
    for summary in (mine, other):
        parent = summary["mlflow"]["parent_run_id"]
        assert client.get_run(parent).info.status == "FINISHED"
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
        assert {r.data.tags.get("trainflow.stage") for r in children} >= {"sweep", "train"}
        assert {r.data.tags.get("trainflow.run_id") for r in children} == {summary["run_id"]}
    # Both promoted at about the same time: the champion is the better one.
    values = {
        str(v.version): float(v.tags["gate.value"])
        for v in client.search_model_versions("name='digits-smoke'")
    }
    champion = client.get_model_version_by_alias("digits-smoke", "champion")
    assert values[str(champion.version)] == max(values.values()), values
