"""The whole pipeline as a user runs it: `trainflow run` in a subprocess, MLflow read back."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from cli_runner import run_cli, run_log_of
from smoke_runs import CANARIES

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# Each epoch's throughput, logged on the trial runs beside the model's metrics.
THROUGHPUT = ("train_rows_per_s", "data_wait_share")

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")


def _run(
    home: Path, *args: str, timeout: int = 600, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return run_cli(home, *args, timeout=timeout, **(env_extra or {}))


# The runs themselves are session fixtures (tests/e2e/conftest.py): test_mlflow_ui.py reads the
# second one too.
@pytest.fixture(scope="module")
def home(smoke_home) -> Path:
    return smoke_home


@pytest.fixture(scope="module")
def watched_run(smoke_watched_run):
    return smoke_watched_run


@pytest.fixture(scope="module")
def first_run(watched_run):
    summary, proc, _, _ = watched_run
    return summary, proc


@pytest.fixture(scope="module")
def client(home, first_run):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")


def _children(client, experiment_id: str, parent_id: str):
    return client.search_runs(
        [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )


def test_summary_names_every_stage_and_prints_it(first_run):
    summary, proc = first_run
    assert set(summary["stage_seconds"]) == {"preprocess", "sweep", "train", "evaluate", "promote"}
    assert sum(summary["data"]["rows"].values()) == 1797
    assert summary["data"]["preprocess_cached"] is False
    assert summary["test_metrics"]["test_accuracy"] > 0.8
    assert summary["model"]["decision"] == "first-model"
    # The HTML report is best effort (a warning when it fails): this run must have one.
    assert summary["report"] and summary["report"].endswith("report.html")
    for text in ("test_accuracy", "mlflow ui", summary["mlflow"]["parent_run_id"]):
        assert text in proc.stdout, text


def test_the_console_is_short_and_the_libraries_go_to_the_log(first_run):
    """On a non-terminal a whole run is at most 40 lines, none of them a warning;
    what Ray, Tune, Train, Prefect and MLflow print is in the run's log file."""
    summary, proc = first_run
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    assert len(lines) <= 40, "\n".join(lines)
    assert not [line for line in lines if "warning" in line.lower()], lines
    assert [line for line in lines if line.startswith("[5/5] promote:")], lines
    log = run_log_of(proc)
    assert log.is_file() and log.parent.name == "logs"
    text = log.read_text(errors="replace")
    assert "Beginning flow run" in text and "Finished in state Completed" in text  # Prefect
    # One temporary Prefect server, the one the CLI started early: the flow found it running.
    # Prefect says "Starting temporary server on URL" for every one it starts; the early one's
    # line reaches the log only when Prefect's logging was set up in time, a second one's always.
    # (every trainflow line is in the log twice: our format and Prefect's, which the flow adds)
    early = set(re.findall(r"temporary server started early on http://127\.0\.0\.1:(\d+)", text))
    assert len(early) == 1, text[:3000]
    started = set(re.findall(r"Starting temporary server on http://127\.0\.0\.1:(\d+)", text))
    assert started <= early, text[:3000]
    assert text.index("temporary server started early") < text.index("Beginning flow run")
    assert "Starting execution of Dataset" in text  # Ray Data
    assert "trainflow.progress" in text  # our own events, with timestamps
    assert lines[-1] == f"log     {log}"  # named again at the end of the summary


def test_every_listener_of_a_run_is_loopback(watched_run):
    """The sockets of every process a run starts (Prefect's temporary server, the
    local Ray instance's GCS, raylet, agents, metrics exporters and workers, the dashboard, the
    driver, and rank 0's torch rendezvous store while DDP runs) listen on 127.0.0.1 only; Ray's
    token authentication is on as well (docs/reliability.md, "Ports")."""
    _, _, listeners, _ = watched_run
    assert listeners, "no listening socket was seen"
    names = {entry["name"] for entry in listeners}
    assert {"gcs_server", "raylet"} <= names, names
    exposed = [
        (e["name"], e["ip"], e["port"])
        for e in listeners
        if e["ip"] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")
    ]
    assert exposed == []
    rays = [
        e
        for e in listeners
        if e["name"] in ("gcs_server", "raylet") or e["name"].startswith("ray::")
    ]
    assert {e["auth_mode"] for e in rays} == {"token"}, rays


def test_no_canary_credential_is_written_anywhere(home, watched_run):
    """MLflow's db and artifacts, the Prefect home and its db, the Ray storage root (results,
    checkpoints, Tune state) and the run's whole Ray session (every log of every Ray process)
    all live in the home; our logs are the process's output."""
    _, proc, _, sessions = watched_run
    secrets = [value.encode() for value in CANARIES.values()]
    logs = (proc.stdout + proc.stderr).encode()
    assert [s for s in secrets if s in logs] == []
    # <home>/ray is the runs' Ray temp dir, or a link to it when the home is too deep for
    # Unix socket paths: read it through the link. The first run's one session, as counted
    # when it ended (the second run, shared with test_mlflow_ui.py, may have added its own).
    ray_root = (home / "ray").resolve()
    assert len(sessions) == 1, sessions
    assert (sessions[0] / "logs" / "runtime_env_agent.log").is_file()
    files = [p for p in [*home.rglob("*"), *ray_root.rglob("*")] if p.is_file()]
    names = {p.relative_to(home).parts[0] for p in files if p.is_relative_to(home)}
    assert {"mlflow.db", "mlartifacts", "prefect", "storage"} <= names, names
    assert any(p.name.startswith("prefect.db") for p in (home / "prefect").iterdir())
    leaks = [
        f"{path}: {secret.decode()}"
        for path in files
        for secret in secrets
        if secret in path.read_bytes()
    ]
    assert leaks == []


def test_mlflow_run_tree_histories_and_registry(first_run, client):
    summary, _ = first_run
    experiment_id = summary["mlflow"]["experiment_id"]
    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["train.num_workers"] == "2"
    assert {"report.html", "summary.json"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }

    stages = {
        r.data.tags.get("trainflow.stage"): r
        for r in _children(client, experiment_id, parent.info.run_id)
    }
    assert {"sweep", "train", "evaluate"} <= set(stages)

    trials = _children(client, experiment_id, stages["sweep"].info.run_id)
    assert len(trials) == 4
    fates = {
        t.data.tags.get("trainflow.trial_id"): t.data.tags.get("trainflow.fate") for t in trials
    }
    assert fates == {t["trial_id"]: t["status"] for t in summary["sweep"]["trials"]}
    for trial in trials:
        history = client.get_metric_history(trial.info.run_id, "val_accuracy")
        assert [m.step for m in history] == list(range(1, len(history) + 1)), trial.info.run_id
        assert "train.lr" in trial.data.params
        if trial.data.tags["trainflow.fate"] == "stopped-early":
            assert int(trial.data.tags["trainflow.stopped_at_iteration"]) == len(history)

    train_history = client.get_metric_history(stages["train"].info.run_id, "val_loss")
    assert sorted(m.step for m in train_history) == [1, 2, 3]
    assert stages["evaluate"].data.metrics["test_accuracy"] == pytest.approx(
        summary["test_metrics"]["test_accuracy"]
    )
    artifacts = [a.path for a in client.list_artifacts(stages["evaluate"].info.run_id, "plots")]
    assert "plots/confusion_matrix.png" in artifacts

    all_runs = client.search_runs([experiment_id], max_results=1000)
    assert not [r.info.run_id for r in all_runs if r.info.status == "RUNNING"]

    version = client.get_model_version_by_alias("digits-smoke", "champion")
    assert str(version.version) == str(summary["model"]["version"])
    assert version.run_id == stages["train"].info.run_id
    assert "challenger" in client.get_model_version("digits-smoke", version.version).aliases


def test_mlflow_ui_story_of_the_run_tree(first_run, client):
    """The smoke run's store in MLflow: the experiment is a model-training
    one; the parent run holds the champion's params (the train run's), the sweep's space, a
    description linking its runs and version, source and user; trials log the model's metrics
    only; no second copy of a metric or plot; the summary prints a training-view link."""
    summary, proc = first_run
    experiment_id = summary["mlflow"]["experiment_id"]
    experiment = client.get_experiment(experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    stages = {
        r.data.tags.get("trainflow.stage"): r
        for r in _children(client, experiment_id, parent.info.run_id)
    }
    train = stages["train"]
    # the training config (the logged model adds its own model_config, e.g. `device`)
    shared = {k: v for k, v in train.data.params.items() if k.startswith(("train.", "model."))}
    assert "train.lr" in shared and "model.dropout" in shared
    assert {k: parent.data.params.get(k) for k in shared} == shared
    for key, value in summary["sweep"]["best_params"].items():
        assert parent.data.params[key] == str(value)
    assert "search_space.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    note = parent.data.tags["mlflow.note.content"]
    for run in (train, stages["evaluate"]):
        assert f"/runs/{run.info.run_id}?workflowType=machine_learning)" in note
    assert f"/runs/{stages['sweep'].data.tags['best_trial_run_id']}?workflowType" in note
    assert f"/#/models/digits-smoke/versions/{summary['model']['version']}" in note
    for run in (parent, *stages.values()):
        assert run.data.tags["mlflow.source.name"] == "trainflow run", run.info.run_name
        assert run.data.tags["mlflow.user"], run.info.run_name

    trials = _children(client, experiment_id, stages["sweep"].info.run_id)
    for trial in trials:
        assert set(trial.data.metrics) == {"train_loss", "val_loss", "val_accuracy", *THROUGHPUT}
        assert "trial_name" not in trial.data.tags
        assert trial.data.tags["mlflow.source.name"] == "trainflow run"

    evaluate = stages["evaluate"]
    assert "accuracy_score" not in evaluate.data.metrics
    assert "confusion_matrix.png" not in {
        a.path for a in client.list_artifacts(evaluate.info.run_id)
    }
    link = f"/#/experiments/{experiment_id}/runs/{parent.info.run_id}"
    assert summary["mlflow"]["run_url"].endswith(f"{link}?workflowType=machine_learning")
    assert summary["mlflow"]["run_url"] in proc.stdout


def test_every_kept_checkpoint_is_a_logged_model_that_evaluates(home, first_run, client):
    """Each checkpoint the final training kept (num_to_keep 2) is a logged model of the train
    run named by its epoch, an output at that step with the epoch's metrics linked by dataset;
    the registered version is the best one's; `trainflow evaluate --model models:/<id>` scores
    the other one."""
    summary, _ = first_run
    experiment_id = summary["mlflow"]["experiment_id"]
    stages = {
        r.data.tags.get("trainflow.stage"): r
        for r in _children(client, experiment_id, summary["mlflow"]["parent_run_id"])
    }
    train = stages["train"].info.run_id
    models = client.search_logged_models(
        experiment_ids=[experiment_id], filter_string=f"source_run_id = '{train}'"
    )
    by_epoch = {int(m.tags["trainflow.epoch"]): m for m in models}
    assert len(models) == len(by_epoch) == 2 and set(by_epoch) <= {1, 2, 3}
    outputs = client.get_run(train).outputs.model_outputs
    assert {(o.model_id, o.step) for o in outputs} == {(m.model_id, e) for e, m in by_epoch.items()}
    history = {m.step: m.value for m in client.get_metric_history(train, "val_accuracy")}
    for epoch, model in by_epoch.items():
        assert model.name == f"digits-smoke-epoch-{epoch}"
        linked = {m.key: m for m in model.metrics if m.run_id == train}
        assert {"train_loss", "val_loss", "val_accuracy"} <= set(linked)
        assert linked["val_accuracy"].value == pytest.approx(history[epoch])
        assert linked["val_accuracy"].step == epoch
        assert linked["val_accuracy"].dataset_name.endswith(" [val]")
    # the registered version is the best checkpoint's model, not a third copy
    registered = summary["model"]["logged_model_uri"].removeprefix("models:/")
    best = next(e for e, m in by_epoch.items() if m.model_id == registered)
    other = next(e for e in by_epoch if e != best)
    assert history[best] >= history[other]
    other = by_epoch[other]
    proc = _run(home, "evaluate", "--config", SMOKE, "--model", f"models:/{other.model_id}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    accuracy = re.search(r"test_accuracy\W+([01]\.\d+)", proc.stdout)
    assert accuracy and 0.5 < float(accuracy.group(1)) <= 1.0, proc.stdout[-2000:]


def test_second_run_reuses_preprocessing_and_serves_the_champion(
    home, first_run, smoke_second_run, client, tmp_path
):
    # The second run logged through an `mlflow server` over the same store (conftest.py).
    second, _ = smoke_second_run
    assert second["data"]["preprocess_cached"] is True
    assert second["data"]["fingerprint"] == first_run[0]["data"]["fingerprint"]
    assert second["model"]["version"] == str(int(first_run[0]["model"]["version"]) + 1)
    # the same data as the champion's: measured against it (docs/gate.md), no drift
    parent = client.get_run(second["mlflow"]["parent_run_id"])
    assert parent.data.metrics["drift_max_psi"] == 0.0
    assert parent.data.tags["trainflow.drift.champion_version"] == first_run[0]["model"]["version"]
    assert "drift.json" in [a.path for a in client.list_artifacts(parent.info.run_id)]

    # predict on raw rows with the champion, straight from the registry
    import pyarrow.parquet as pq

    raw = pq.read_table(home / "datasets" / "digits" / "digits.parquet").slice(0, 50)
    pq.write_table(raw.drop(["label"]), tmp_path / "new.parquet")
    preds = tmp_path / "preds.parquet"
    proc = _run(
        home,
        "predict",
        "--config",
        SMOKE,
        "--model",
        "models:/digits-smoke@champion",
        "--input",
        str(tmp_path / "new.parquet"),
        "--output",
        str(preds),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = pq.read_table(preds)
    assert table.num_rows == 50
    agreement = sum(
        int(p == t)
        for p, t in zip(table["prediction"].to_pylist(), raw["label"].to_pylist(), strict=True)
    )
    assert agreement >= 40

    proc = _run(
        home,
        "evaluate",
        "--config",
        SMOKE,
        "--model",
        "models:/digits-smoke@champion",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "test_accuracy" in proc.stdout
    assert list((home / "cwd").iterdir()) == []  # no stray mlflow.db / mlruns in the cwd


def _last_flow_run_logs(home: Path) -> tuple[str, list[str]]:
    """(state message, log messages) of the newest flow run in the home's Prefect database."""
    import sqlite3

    with sqlite3.connect(home / "prefect" / "prefect.db") as db:
        run_id, message = db.execute(
            "SELECT f.id, s.message FROM flow_run f JOIN flow_run_state s ON f.state_id = s.id "
            "ORDER BY f.created DESC LIMIT 1"
        ).fetchone()
        logs = [
            row[0] for row in db.execute("SELECT message FROM log WHERE flow_run_id = ?", (run_id,))
        ]
    return message or "", logs


@pytest.fixture(scope="module")
def nan_label_csv(home) -> Path:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pq.read_table(home / "datasets" / "digits" / "digits.parquet").slice(0, 200)
    labels = [None if i % 50 == 0 else float(v) for i, v in enumerate(table["label"].to_pylist())]
    import pyarrow as pa

    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels))
    path = home / "nan-labels.csv"
    pacsv.write_csv(table, path)
    return path


@pytest.mark.parametrize(
    "case",
    ["missing label column", "NaN labels", "unreachable MLflow"],
)
def test_user_errors_get_one_message_and_no_traceback(home, first_run, client, nan_label_csv, case):
    """A user error is one message naming the problem and the fix — on the console and
    in the flow run's Prefect logs and state — with no traceback anywhere, exit code 2, never
    retried, and nothing left behind (no model version, no RUNNING MLflow run). A local input's
    missing labels are refused by the CLI before the flow (and anything else) starts."""
    from cli_runner import free_port

    sets, expected = {
        "missing label column": (["data.label_column=species"], ["species", "data.label_column"]),
        "NaN labels": ([f"data.source={nan_label_csv}"], ["no value in label column", "drop"]),
        "unreachable MLflow": (
            [f"mlflow.tracking_uri=http://127.0.0.1:{free_port()}"],
            ["not reachable", "trainflow up"],
        ),
    }[case]
    before = client.search_model_versions("name='digits-smoke'")
    newest_flow_run = _last_flow_run_logs(home)
    args = [item for pair in (("--set", s) for s in sets) for item in pair]
    proc = _run(home, "run", "--config", SMOKE, *args)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    if case == "NaN labels":  # refused before the flow: no flow run, no run log
        assert _last_flow_run_logs(home) == newest_flow_run
        assert "libraries log to" not in proc.stdout
    else:
        assert "Retry" not in run_log_of(proc).read_text(errors="replace")  # never retried
        state_message, logs = _last_flow_run_logs(home)
        assert expected[0] in state_message, state_message
        assert any(expected[0] in line for line in logs), logs
        assert not [line for line in logs if "Traceback" in line], logs
    after = client.search_model_versions("name='digits-smoke'")
    assert len(after) == len(before)
    experiment = client.get_experiment_by_name("trainflow-smoke")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]


def test_bad_config_fails_before_anything_starts(home):
    proc = _run(home, "run", "--set", "train.lr=-1", "--set", "sweep.asha.grace_period=99")
    assert proc.returncode == 2
    assert "train.lr" in proc.stderr and "greater than 0" in proc.stderr
    assert "grace_period" in proc.stderr


# The champion is an MLflow pyfunc any client can use on the raw table.


@pytest.fixture(scope="module")
def champion_rows(home, first_run, client, tmp_path_factory):
    """The raw test rows (without the label) and the champion version that will score them."""
    from champion_checks import raw_test_rows

    rows = raw_test_rows(home / "datasets" / "digits" / "digits.parquet")
    where = tmp_path_factory.mktemp("champion")
    rows.drop(columns=["label"]).to_parquet(where / "test.parquet")
    version = client.get_model_version_by_alias("digits-smoke", "champion")
    return rows, where, version


def test_champion_loads_without_trainflow_and_matches_the_evaluate_stage(home, champion_rows):
    """mlflow.pyfunc.load_model in a Python where trainflow cannot be imported: the evaluate
    stage's accuracy on the same raw test rows; lineage on the version and runs."""
    from champion_checks import check_lineage, predict_without_trainflow

    rows, where, version = champion_rows
    uri = f"sqlite:///{home / 'mlflow.db'}"
    out = predict_without_trainflow(
        uri, "models:/digits-smoke@champion", where / "test.parquet", where / "preds.parquet"
    )
    assert out == {"rows": len(rows), "columns": ["prediction", *map(str, range(10))]}
    preds = pd.read_parquet(where / "preds.parquet")
    accuracy = float((preds["prediction"].to_numpy() == rows["label"].to_numpy()).mean())
    assert accuracy == pytest.approx(float(version.tags["test_accuracy"]), abs=1e-6)
    assert int(float(version.tags["test_rows"])) == len(rows)
    for key in ("data_fingerprint", "config_hash", "source_run", "trainflow.run_id"):
        assert version.tags.get(key), key
    assert "ASHA trials" in version.description and "gate on" in version.description
    check_lineage(uri, version, accuracy)


def test_mlflow_models_serve_answers_like_the_in_process_pyfunc(home, champion_rows):
    import mlflow.pyfunc
    from champion_checks import Served
    from cli_runner import free_port

    rows, where, _ = champion_rows
    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/digits-smoke@champion")
    batch = rows.drop(columns=["label"]).head(20)
    expected = model.predict(batch)
    served = Served(uri, "models:/digits-smoke@champion", free_port(), where / "serve.log")
    try:
        served.wait_ready()
        split = json.loads(batch.to_json(orient="split", index=False))
        status, body = served.invoke({"dataframe_split": split})
        assert status == 200, body
        got = pd.DataFrame(body["predictions"])
        assert got["prediction"].tolist() == expected["prediction"].tolist()
        assert got["3"].to_numpy() == pytest.approx(expected["3"].to_numpy(), abs=1e-6)
        records = json.loads(batch.head(3).to_json(orient="records"))
        status, body = served.invoke({"dataframe_records": records})
        assert status == 200, body
        assert [r["prediction"] for r in body["predictions"]] == expected["prediction"][:3].tolist()
        bad = json.loads(batch.drop(columns=["pixel_07"]).to_json(orient="split", index=False))
        status, body = served.invoke({"dataframe_split": bad})
        assert status == 400 and "pixel_07" in body["message"], body
        # A gap is data (data.missing: impute): filled with the train median, as in-process.
        gap = batch.head(2).assign(pixel_05=None)
        status, body = served.invoke({"dataframe_records": gap.to_dict(orient="records")})
        assert status == 200, body
        filled = model.predict(gap)
        assert [r["prediction"] for r in body["predictions"]] == filled["prediction"].tolist()
        text = batch.head(2).assign(pixel_05="dark")
        status, body = served.invoke({"dataframe_records": text.to_dict(orient="records")})
        assert status == 400 and "pixel_05" in body["message"], body
    finally:
        served.stop()
    assert served.proc.returncode is not None
