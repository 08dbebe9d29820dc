"""training.tracking against a real sqlite MLflow store (one per module: creating it takes ~2 s)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from model_states import raw_rows, trainflow_state

from training.config import GateConfig, MlflowConfig, PipelineConfig
from training.errors import ModelNotFoundError, ServiceUnreachableError
from training.storage import default_artifact_root, default_tracking_uri
from training.tracking.flavour import log_model, state_file
from training.tracking.registry import promote

EXPERIMENT = "trainflow-unit"


def make_config(**mlflow) -> PipelineConfig:
    return PipelineConfig(mlflow=MlflowConfig(experiment=EXPERIMENT, **mlflow))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A trainflow home of this module: the default sqlite store lives in it."""
    path = tmp_path_factory.mktemp("tracking-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFLOW_HOME", str(path))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield path


@pytest.fixture(scope="module")
def tracker(home):
    from training.tracking.store import configure

    return configure(make_config())


@pytest.fixture(scope="module")
def registered(tracker, home):
    """One model logged and registered as version 1 of its own registered model."""
    import torch

    from training.tracking.store import configure

    state = trainflow_state()
    state_path = home / "state.pt"
    torch.save(state, state_path)
    own = configure(make_config(registered_model="unit-registered"))
    parent = own.start_parent_run("register", {})
    run = own.start_child_run(parent, "promote", "promote")
    info = log_model(
        own, run, str(state_path), raw_rows(), "unit test model", {"data.fingerprint": "abc"}
    )
    return {"tracker": own, "info": info, "run": run, "state": state, "parent": parent}


def statuses(tracker, run_ids):
    return {run_id: tracker.client.get_run(run_id).info.status for run_id in run_ids}


# ---------------------------------------------------------------------------------- configuration


def test_resolve_tracking_uri_order(home, monkeypatch):
    from training.tracking.store import resolve_tracking_uri

    assert resolve_tracking_uri(MlflowConfig()) == default_tracking_uri()
    assert default_tracking_uri().endswith(f"{home}/mlflow.db")
    cfg = MlflowConfig(tracking_uri="sqlite:////tmp/other.db")
    assert resolve_tracking_uri(cfg) == "sqlite:////tmp/other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999/")
    assert resolve_tracking_uri(cfg) == "http://127.0.0.1:5999"


def test_experiment_artifacts_under_home(tracker, home):
    from training.tracking import ui

    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.name == EXPERIMENT
    assert experiment.artifact_location == f"{default_artifact_root()}/{EXPERIMENT}"
    assert experiment.artifact_location.startswith(home.as_uri())
    assert tracker.tracking_uri == default_tracking_uri()
    assert ui.command(tracker) == (
        f"mlflow ui --backend-store-uri {default_tracking_uri()} --host 127.0.0.1 --port 5000"
    )
    assert ui.run_url(tracker, "abc") is None
    # The embedded store gets the command, then a link into the training view.
    runs = f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs"
    assert ui.runs_url(tracker) == f"{runs}?workflowType=machine_learning"
    assert ui.how_to_open(tracker, ui.run_page_url(tracker, "abc")) == (
        f"start the UI with `{ui.command(tracker)}`, then open {runs}/abc"
        "?workflowType=machine_learning"
    )
    # ... and the experiment is a model-training one in MLflow's UI.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert ui.training_experiments(tracker.tracking_uri) == {
        EXPERIMENT: f"{tracker.tracking_uri}/#/experiments/{tracker.experiment_id}/runs"
        "?workflowType=machine_learning"
    }


def test_configure_again_reuses_experiment(tracker):
    from training.tracking.store import configure

    assert configure(make_config()).experiment_id == tracker.experiment_id


def test_an_experiment_created_before_the_kind_tag_gets_it(tracker):
    from training.tracking.store import configure

    tracker.client.delete_experiment_tag(tracker.experiment_id, "mlflow.experimentKind")
    configure(make_config(), create=False)  # reading only changes nothing
    assert "mlflow.experimentKind" not in tracker.client.get_experiment(tracker.experiment_id).tags
    configure(make_config())
    tags = tracker.client.get_experiment(tracker.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_http_urls_drop_credentials():
    from training.tracking import ui
    from training.tracking.runs import Tracker

    remote = Tracker(None, "http://alice:s3cret@mlflow.internal:5000", "7", make_config())
    assert ui.command(remote) == "http://mlflow.internal:5000"
    assert ui.run_url(remote, "r1") == (
        "http://mlflow.internal:5000/#/experiments/7/runs/r1?workflowType=machine_learning"
    )
    assert ui.how_to_open(remote, ui.runs_url(remote)) == (
        "http://mlflow.internal:5000/#/experiments/7/runs?workflowType=machine_learning"
    )
    assert ui.artifact_url(remote, "r1", "report.html") == (
        "http://mlflow.internal:5000/#/experiments/7/runs/r1/artifactPath/report.html"
    )
    assert ui.model_version_url(remote, "digits", 3) == (
        "http://mlflow.internal:5000/#/models/digits/versions/3"
    )


def test_unreachable_server_fails_fast(monkeypatch):
    from training.tracking.store import configure

    with socket.socket() as sock:  # a loopback port that is certainly closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:s3cret@127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(ServiceUnreachableError) as excinfo:
        configure(make_config())
    assert time.monotonic() - start < 6
    message = str(excinfo.value)
    assert f"127.0.0.1:{port}" in message
    assert "trainflow up" in message
    assert "MLFLOW_TRACKING_URI" in message
    assert "s3cret" not in message
    assert excinfo.value.retriable
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"  # bounded retries were set


@pytest.fixture
def health_server():
    """A loopback HTTP server whose /health answers with the status in ``state["status"]``."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    state = {"status": 200, "paths": [], "auth": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state["paths"].append(self.path)
            state["auth"].append(self.headers.get("Authorization"))
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_port}"
    yield state
    server.shutdown()
    server.server_close()


def test_health_check(health_server):
    import base64

    from training.tracking.store import check_reachable

    check_reachable(health_server["url"] + "/prefix")
    assert health_server["paths"] == ["/prefix/health"]
    assert health_server["auth"] == [None]

    credentials = health_server["url"].replace("http://", "http://alice:s3cret@")
    check_reachable(credentials)
    assert health_server["auth"][-1] == "Basic " + base64.b64encode(b"alice:s3cret").decode()

    health_server["status"] = 401  # reachable; authentication is MLflow's client's business
    check_reachable(health_server["url"])

    health_server["status"] = 503
    with pytest.raises(ServiceUnreachableError, match="HTTP 503") as excinfo:
        check_reachable(credentials)
    assert "s3cret" not in str(excinfo.value)


# ------------------------------------------------------------------------------------------- runs


def test_parent_run_get_or_create(tracker):
    first = tracker.start_parent_run("flow-1", {"trainflow.trigger": "unit"})
    assert tracker.start_parent_run("flow-1", {}) == first
    other = tracker.start_parent_run("flow-2", {})
    assert other != first

    run = tracker.client.get_run(first)
    assert run.info.run_name == "pipeline-flow-1"
    assert run.info.status == "RUNNING"
    assert run.data.tags["trainflow.run_id"] == "flow-1"
    assert run.data.tags["trainflow.stage"] == "pipeline"
    assert run.data.tags["trainflow.trigger"] == "unit"
    assert run.data.tags["version.mlflow"] == "3.17.2"
    assert "mlflow.parentRunId" not in run.data.tags

    # A re-run after the run ended resumes the same run, RUNNING again.
    tracker.end_run(first, "FAILED")
    assert tracker.client.get_run(first).info.status == "FAILED"
    assert tracker.start_parent_run("flow-1", {}) == first
    assert tracker.client.get_run(first).info.status == "RUNNING"
    tracker.close_unfinished(first, "KILLED")
    tracker.close_unfinished(other, "KILLED")


def test_parent_run_params_and_config(tracker):
    config = tracker.config
    parent = tracker.start_parent_run("flow-params", {})
    params = tracker.client.get_run(parent).data.params
    # The swept keys wait for the sweep's champion (the sweep stage logs them).
    swept = set(config.sweep.search_space) if config.sweep.enabled else set()
    assert params == {k: str(v) for k, v in config.flat().items() if k not in swept}
    assert len(params) > 30

    local = tracker.client.download_artifacts(parent, "config.yaml")
    assert yaml.safe_load(Path(local).read_text()) == config.model_dump(mode="json")
    tracker.end_run(parent)


def test_no_credentials_logged(home):
    from training.config import StorageConfig
    from training.tracking.store import configure

    config = PipelineConfig(
        mlflow=MlflowConfig(experiment=EXPERIMENT),
        storage=StorageConfig(root="s3://bucket/prefix"),
    )
    # The config refuses credentials in endpoint_url; redaction still guards what slips by.
    config.storage.__dict__["endpoint_url"] = "http://bob:hunter2@s3:9000"
    tracker = configure(config)
    parent = tracker.start_parent_run("flow-secret", {"note": "https://bob:hunter2@host/x"})
    run = tracker.client.get_run(parent)
    assert run.data.params["storage.endpoint_url"] == "http://***@s3:9000"
    assert run.data.tags["note"] == "https://***@host/x"
    text = Path(tracker.client.download_artifacts(parent, "config.yaml")).read_text()
    everything = f"{run.data.params} {run.data.tags} {text}"
    assert "hunter2" not in everything
    assert "bob" not in everything
    tracker.end_run(parent)


def test_log_params_batches_and_truncates(tracker, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRUNCATE_LONG_VALUES", "false")  # MLflow must not do it for us
    parent = tracker.start_parent_run("flow-many-params", {})
    run = tracker.start_child_run(parent, "many", "test")
    params = {f"p{i:03d}": i for i in range(250)}
    params["long"] = "x" * 7000
    tracker.log_params(run, params)
    logged = tracker.client.get_run(run).data.params
    assert len(logged) == 251
    assert logged["p249"] == "249"
    assert logged["long"] == "x" * 6000
    tracker.close_unfinished(parent, "KILLED")


def test_child_run_get_or_create(tracker):
    parent = tracker.start_parent_run("flow-children", {})
    train = tracker.start_child_run(parent, "train", "train", {"extra": "1"})
    assert tracker.start_child_run(parent, "train", "train") == train
    evaluate = tracker.start_child_run(parent, "evaluate", "evaluate")
    assert evaluate != train
    # the same name under another parent is another run
    other_parent = tracker.start_parent_run("flow-children-2", {})
    assert tracker.start_child_run(other_parent, "train", "train") != train

    run = tracker.client.get_run(train)
    assert run.info.run_name == "train"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["trainflow.stage"] == "train"
    assert run.data.tags["trainflow.run_id"] == "flow-children"
    assert run.data.tags["extra"] == "1"

    tracker.end_run(train)
    assert tracker.start_child_run(parent, "train", "train") == train  # a retried stage resumes
    assert tracker.client.get_run(train).info.status == "RUNNING"
    # children never count as parents of a pipeline run id
    assert tracker.start_parent_run("flow-children", {}) == parent
    tracker.close_unfinished(parent, "KILLED")
    tracker.close_unfinished(other_parent, "KILLED")


def test_log_history_and_metrics(tracker):
    parent = tracker.start_parent_run("flow-history", {})
    run = tracker.start_child_run(parent, "train", "train")
    rows = [
        {"epoch": 1, "train_loss": 1.0, "val_accuracy": 0.5, "note": "warm-up"},
        {"epoch": 2, "train_loss": 0.6, "val_accuracy": float("nan"), "done": False},
        {"epoch": 3, "train_loss": np.float32(0.25), "val_accuracy": 0.9},
    ]
    tracker.log_history(run, rows)
    history = tracker.client.get_metric_history(run, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.6), (3, 0.25)]
    accuracy = tracker.client.get_metric_history(run, "val_accuracy")
    assert sorted((m.step, m.value) for m in accuracy) == [(1, 0.5), (3, 0.9)]  # NaN skipped
    metrics = tracker.client.get_run(run).data.metrics
    assert "note" not in metrics and "done" not in metrics and "epoch" not in metrics

    tracker.log_metrics(run, {"test_accuracy": 0.93, "label": "x"}, step=7)
    (point,) = tracker.client.get_metric_history(run, "test_accuracy")
    assert (point.step, point.value) == (7, 0.93)
    assert "label" not in tracker.client.get_run(run).data.metrics
    tracker.close_unfinished(parent, "KILLED")


def test_log_history_again_adds_only_new_steps(tracker):
    """A resumed run repeats a stage that had finished (stopped during evaluation): its history
    is logged again, and each epoch must still appear once."""
    parent = tracker.start_parent_run("flow-history-again", {})
    run = tracker.start_child_run(parent, "train", "train")
    rows = [{"epoch": e, "train_loss": 1.0 / e, "val_accuracy": 0.1 * e} for e in (1, 2, 3)]
    tracker.log_history(run, rows[:2])
    tracker.log_history(run, rows)  # the resumed stage: every epoch, two of them logged already
    for key in ("train_loss", "val_accuracy"):
        steps = sorted(m.step for m in tracker.client.get_metric_history(run, key))
        assert steps == [1, 2, 3], (key, steps)
    tracker.close_unfinished(parent, "KILLED")


def test_the_history_sink_logs_each_epoch_once_and_reads_the_run_once(tracker, monkeypatch):
    """Epochs arriving one by one while training (a resumed run already holding epoch 1)."""
    parent = tracker.start_parent_run("flow-history-sink", {})
    run = tracker.start_child_run(parent, "train", "train")
    rows = [{"epoch": e, "train_loss": 1.0 / e, "val_accuracy": 0.1 * e} for e in (1, 2, 3)]
    tracker.log_history(run, rows[:1])
    reads = []
    history = tracker.client.get_metric_history
    monkeypatch.setattr(
        tracker.client, "get_metric_history", lambda *a: reads.append(a) or history(*a)
    )
    sink = tracker.history_sink(run)
    for row in rows:
        sink([row])
    sink(rows)  # the end of training hands every row again
    for key in ("train_loss", "val_accuracy"):
        steps = sorted(m.step for m in history(run, key))
        assert steps == [1, 2, 3], (key, steps)
    assert len(reads) == 2  # the two keys' histories, once
    tracker.close_unfinished(parent, "KILLED")


def test_log_history_many_points(tracker):
    parent = tracker.start_parent_run("flow-long-history", {})
    rows = [{"epoch": e, "a": e, "b": -e, "c": e / 2} for e in range(400)]  # 1200 > 1000 per batch
    tracker.log_history(parent, rows)
    assert len(tracker.client.get_metric_history(parent, "c")) == 400
    tracker.end_run(parent)


def test_artifacts(tracker, tmp_path):
    from training.report.plots import confusion_matrix_png

    parent = tracker.start_parent_run("flow-artifacts", {})
    png = confusion_matrix_png([[3, 1], [0, 4]], ["a", "b"], str(tmp_path / "cm.png"))
    tracker.log_figure(parent, png, "plots/confusion_matrix.png")
    tracker.log_dict(parent, {"accuracy": 0.9}, "metrics/test.json")
    tracker.log_text(parent, "hello", "notes/readme.md")
    tracker.log_artifact(parent, png, "raw")
    listed = {f.path for f in tracker.client.list_artifacts(parent, "plots")}
    assert listed == {"plots/confusion_matrix.png"}
    local = tracker.client.download_artifacts(parent, "plots/confusion_matrix.png")
    assert Path(local).read_bytes() == Path(png).read_bytes()
    assert {f.path for f in tracker.client.list_artifacts(parent, "raw")} == {"raw/cm.png"}
    tracker.end_run(parent)


def test_close_unfinished_leaves_nothing_running(tracker):
    parent = tracker.start_parent_run("flow-crash", {})
    sweep = tracker.start_child_run(parent, "sweep", "sweep")
    trials = [tracker.start_child_run(sweep, f"trial-{i}", "trial") for i in range(3)]
    done = tracker.start_child_run(parent, "preprocess", "preprocess")
    tracker.end_run(done)
    tracker.end_run(trials[0])
    grandchild_of_trial = tracker.start_child_run(trials[1], "inner", "train")

    closed = tracker.close_unfinished(parent, "FAILED")
    assert set(closed) == {parent, sweep, trials[1], trials[2], grandchild_of_trial}
    tree = {run.info.run_id: run.info.status for run in tracker.find_runs(parent)}
    assert set(tree) == {sweep, done, grandchild_of_trial, *trials}
    assert "RUNNING" not in tree.values()
    assert tree[done] == "FINISHED" and tree[trials[0]] == "FINISHED"
    assert tree[trials[2]] == "FAILED" and tree[grandchild_of_trial] == "FAILED"
    assert tracker.client.get_run(parent).info.status == "FAILED"
    assert tracker.close_unfinished(parent, "KILLED") == []  # nothing left to close
    with pytest.raises(ValueError):
        tracker.close_unfinished(parent, "RUNNING")


def test_tune_callback_one_finished_run_per_trial(tracker):
    """A trial run holds the model's metrics per epoch (step = epoch), its
    values as params, a short name and its trial id; none of Tune's or the loop's bookkeeping,
    no Ray ``trial_name`` tag, and a mid-epoch checkpoint's report logs nothing."""
    from training.tracking.sweep_runs import tune_callback

    parent = tracker.start_parent_run("flow-sweep", {})
    sweep = tracker.start_child_run(parent, "sweep", "sweep")
    callback = tune_callback(tracker, sweep)
    assert callback.tags["mlflow.parentRunId"] == sweep
    assert callback.should_save_artifact is False

    class FakeTrial:  # what the callback reads from a Tune Trial
        def __init__(self, trial_id, lr):
            self.trial_id = trial_id
            self.config = {"train.lr": lr, "model.hidden_sizes": [128, 64]}

        def __str__(self):
            return f"_function_trial_{self.trial_id}"

    callback.setup()
    trials = [FakeTrial("898e2_00000", 0.01), FakeTrial("898e2_00001", 0.02)]
    bookkeeping = {
        "training_iteration": 1,
        "time_this_iter_s": 0.4,
        "time_total_s": 1.2,
        "timestamp": 1700000000,
        "done": False,
        "pid": 4242,
        "workers": 1.0,
        "lr": 0.01,
        "iterations_since_restore": 1,
        "config/train.lr": 0.01,
    }
    for trial in trials:
        callback.log_trial_start(trial)
        for iteration, epoch in ((1, 1), (2, None), (3, 2)):
            result = {**bookkeeping, "training_iteration": iteration}
            if epoch is None:  # a mid-epoch checkpoint: worst score, no epoch done
                result.update({"epoch_in_progress": 2, "batch": 5, "val_accuracy": -1e9})
            else:
                result.update({"epoch": epoch, "train_loss": 1.0 / epoch})
                result["val_accuracy"] = 0.5 * epoch
            callback.log_trial_result(iteration, trial, result)
        callback.log_trial_end(trial)

    runs = tracker.find_runs(sweep)
    assert sorted(run.info.run_name for run in runs) == ["trial 00", "trial 01"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["trainflow.stage"] == "trial"
        assert run.data.tags["trainflow.run_id"] == "flow-sweep"
        assert run.data.tags["trainflow.trial_id"] in {"898e2_00000", "898e2_00001"}
        assert "trial_name" not in run.data.tags
        assert set(run.data.metrics) == {"train_loss", "val_accuracy"}
        # logged first, so MLflow's compare view opens on it (the result had train_loss first)
        assert list(run.data.metrics)[0] == "val_accuracy"
        assert run.data.metrics["val_accuracy"] == 1.0
        history = tracker.client.get_metric_history(run.info.run_id, "val_accuracy")
        assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 1.0)]
        assert run.data.params["train.lr"] in {"0.01", "0.02"}
        assert run.data.params["model.hidden_sizes"] == "[128, 64]"
    tracker.close_unfinished(parent, "KILLED")


# -------------------------------------------------------------------------------- model registry


def test_log_and_register_model(registered):
    import torch

    tracker, info = registered["tracker"], registered["info"]
    assert info.name == "unit-registered"
    assert info.version == "1"
    assert info.model_uri == "models:/unit-registered/1"
    assert info.source_run_id == registered["run"]
    assert info.state_file == "artifacts/state.pt"
    version = tracker.client.get_model_version("unit-registered", "1")
    assert version.description == "unit test model"
    assert version.tags["data.fingerprint"] == "abc"
    assert version.run_id == registered["run"]
    # logging the model must not end the caller's run
    assert tracker.client.get_run(registered["run"]).info.status == "RUNNING"

    # The logged model is named after the registered model.
    logged = tracker.client.get_logged_model(info.model_id)
    assert logged.name == "unit-registered" and logged.source_run_id == registered["run"]
    for uri in (
        info.model_uri,
        info.logged_model_uri,
        f"runs:/{registered['run']}/unit-registered",
    ):
        path = state_file(tracker, uri)
        assert path.name == "state.pt"
        state = torch.load(path, weights_only=True)
        assert state["spec"]["classes"] == ["setosa", "versicolor", "virginica"]
        expected = registered["state"]["model"]
        assert all(torch.equal(state["model"][k], expected[k]) for k in expected)
    # MLflow exports the URIs it is given; processes started later must not inherit our store.
    assert "MLFLOW_REGISTRY_URI" not in os.environ
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_the_logged_models_files_name_no_build_path(registered, tmp_path):
    """MLmodel names the entry script and the state file inside the model,
    not the temporary directory they were built in (gone once the model is logged)."""
    from training.tracking.flavour import download_model

    tracker, info = registered["tracker"], registered["info"]
    model_dir = download_model(tracker, info.model_uri, str(tmp_path))
    text = (model_dir / "MLmodel").read_text()
    flavour = yaml.safe_load(text)["flavors"]["python_function"]
    assert flavour["model_code_path"] == "trainflow_model.py"
    assert flavour["artifacts"]["state"] == {
        "path": "artifacts/state.pt",
        "uri": "artifacts/state.pt",
    }
    # artifact_path: where the store keeps the model (this test's store lives under /tmp)
    assert [line for line in text.splitlines() if "/tmp" in line] == [
        f"artifact_path: {tracker.client.get_logged_model(info.model_id).artifact_location}"
    ]
    assert (model_dir / "trainflow_model.py").is_file()  # what MLflow loads by that name


def test_register_again_from_same_run_reuses_version(registered, home):
    tracker, info = registered["tracker"], registered["info"]
    again = log_model(tracker, registered["run"], str(home / "state.pt"), raw_rows(3), "x", {})
    assert again == info
    versions = tracker.client.search_model_versions("name = 'unit-registered'")
    assert [str(v.version) for v in versions] == ["1"]


def test_registered_model_predicts_any_batch(registered):
    """The registered pyfunc: raw columns in, the network's softmax of the normalised features
    and the label string out."""
    import mlflow.pyfunc
    import torch

    from training.config import ModelConfig
    from training.model.networks import build_model
    from training.tracking.store import global_uris

    # models:/ URIs resolve through the process-wide registry URI: name the store explicitly,
    # or the test depends on which test last set it.
    with global_uris(registered["tracker"].tracking_uri):
        model = mlflow.pyfunc.load_model(registered["info"].model_uri)
    batch = raw_rows(7, seed=1)
    state = registered["state"]
    net = build_model(ModelConfig(**state["model_config"]), [4], 3)
    net.load_state_dict(state["model"])
    spec = state["spec"]
    x = ((batch.to_numpy() - spec["mean"]) / spec["std"]).astype("float32")
    with torch.no_grad():
        expected = torch.softmax(net.eval()(torch.from_numpy(x)), dim=1).numpy()
    out = model.predict(batch)
    np.testing.assert_allclose(out[spec["classes"]].to_numpy(), expected, rtol=1e-5, atol=1e-6)
    assert out["prediction"].tolist() == [spec["classes"][i] for i in expected.argmax(axis=1)]


def test_model_files_missing(registered):
    tracker = registered["tracker"]
    for uri in ("models:/unit-registered@nobody", "models:/no-such-model/1"):
        with pytest.raises(ModelNotFoundError) as excinfo:
            state_file(tracker, uri)
        assert uri in str(excinfo.value)
        assert "MLflow UI" in str(excinfo.value)


def _versions(registered, name: str, count: int, **gate) -> tuple:
    """A tracker whose registered model ``name`` has ``count`` versions of the logged model."""
    import mlflow

    from training.tracking.store import configure

    tracker = configure(make_config(registered_model=name, gate=GateConfig(**gate)))
    mlflow.set_tracking_uri(tracker.tracking_uri)
    source = registered["info"].logged_model_uri
    versions = [mlflow.register_model(source, name).version for _ in range(count)]
    return tracker, [str(v) for v in versions]


def test_promote_accuracy_gate(registered):
    tracker, (v1, v2, v3, v4) = _versions(
        registered, "unit-gate-acc", 4, metric="test_accuracy", min_delta=0.01
    )
    client, name = tracker.client, "unit-gate-acc"

    first = promote(tracker, v1, 0.80)
    assert first["decision"] == "first-model"
    assert first["champion_version"] == v1
    assert first["aliases"] == ["challenger", "champion"]
    assert str(client.get_model_version_by_alias(name, "champion").version) == v1

    worse = promote(tracker, v2, 0.78)
    assert worse["decision"] == "kept-champion"
    assert worse["champion_version"] == v1
    assert worse["champion_value"] == pytest.approx(0.80)
    assert worse["aliases"] == ["challenger"]
    assert str(client.get_model_version_by_alias(name, "champion").version) == v1
    assert str(client.get_model_version_by_alias(name, "challenger").version) == v2
    tags = client.get_model_version(name, v2).tags
    assert tags["gate.decision"] == "kept-champion"
    assert tags["gate.metric"] == "test_accuracy"
    assert float(tags["gate.value"]) == pytest.approx(0.78)
    assert float(tags["gate.champion_value"]) == pytest.approx(0.80)
    assert tags["gate.previous_champion"] == v1

    barely = promote(tracker, v3, 0.805)  # better, but not by more than min_delta
    assert barely["decision"] == "kept-champion"
    assert str(client.get_model_version_by_alias(name, "champion").version) == v1

    better = promote(tracker, v4, 0.85)
    assert better["decision"] == "promoted"
    assert better["champion_version"] == v4
    assert better["aliases"] == ["challenger", "champion"]
    assert str(client.get_model_version_by_alias(name, "champion").version) == v4
    assert client.get_model_version(name, v4).tags["gate.previous_champion"] == v1
    assert client.get_model_version(name, v1).aliases == []

    # the registered model's state file follows the alias
    assert state_file(tracker, f"models:/{name}@champion").name == "state.pt"


def test_promote_loss_gate_lower_is_better(registered):
    tracker, (v1, v2, v3) = _versions(registered, "unit-gate-loss", 3, metric="test_loss")
    name = "unit-gate-loss"
    assert promote(tracker, v1, 0.50)["decision"] == "first-model"
    higher = promote(tracker, v2, 0.60)
    assert higher["decision"] == "kept-champion"
    assert str(tracker.client.get_model_version_by_alias(name, "champion").version) == v1
    lower = promote(tracker, v3, 0.30)
    assert lower["decision"] == "promoted"
    assert str(tracker.client.get_model_version_by_alias(name, "champion").version) == v3


def test_a_slow_server_gets_one_create_run_not_a_retried_duplicate(monkeypatch):
    """A tracking server slowed by a busy machine answers a POST late: the client must wait for
    it, not time out and send it again (each retry of runs/create made another run)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from mlflow import MlflowClient

    from training.tracking.store import apply_http_defaults

    creates = []

    class SlowCreate(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            creates.append(self.path)
            time.sleep(11)  # past the 10 s timeout trainflow used to set
            run_id = f"run{len(creates)}"
            info = {"run_id": run_id, "run_uuid": run_id, "experiment_id": "0"}
            body = json.dumps(
                {"run": {"info": {**info, "status": "RUNNING", "lifecycle_stage": "active"}}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowCreate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for key in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(key, raising=False)
    try:
        apply_http_defaults()
        run = MlflowClient(f"http://127.0.0.1:{server.server_port}").create_run("0")
    finally:
        server.shutdown()
        server.server_close()
    assert run.info.run_id == "run1"
    assert creates == ["/api/2.0/mlflow/runs/create"]


def test_parent_run_leaves_swept_keys_for_the_champion_and_passes_its_source_down(home):
    """The parent run's params are the champion's (a default logged first
    could never change), and Source / Created by reach every child run."""
    from training.stages.sweep import champion_params
    from training.tracking.store import configure

    config = make_config().with_overrides({"sweep.enabled": True})
    own = configure(config)
    source = {"mlflow.source.name": "trainflow run", "mlflow.user": "ada"}
    parent = own.start_parent_run("flow-champion", source)
    params = own.client.get_run(parent).data.params
    swept = set(config.sweep.search_space)
    assert swept and not swept & set(params)
    assert params["train.max_epochs"] == str(config.train.max_epochs)
    chosen = champion_params(config, {"train.lr": 0.0042, "train.batch_size": 32})
    assert chosen["train.lr"] == 0.0042 and chosen["train.batch_size"] == 32
    assert set(chosen) == swept
    child = own.start_child_run(parent, "train", "train")
    tags = own.client.get_run(child).data.tags
    assert tags["mlflow.source.name"] == "trainflow run" and tags["mlflow.user"] == "ada"
    assert tags["trainflow.run_id"] == "flow-champion"
    own.close_unfinished(parent, "KILLED")


def test_run_tree_links_open_the_training_view(tracker):
    from training.tracking import ui

    parent = tracker.start_parent_run("flow-links", {})
    sweep = tracker.start_child_run(parent, "sweep", "sweep")
    trial = tracker.start_child_run(sweep, "trial 00", "trial")
    tracker.set_tags(sweep, {"best_trial_run_id": trial, "best_trial_name": "trial 00 · lr=0.1"})
    train = tracker.start_child_run(parent, "train", "train")
    evaluate = tracker.start_child_run(parent, "evaluate", "evaluate")
    links = ui.run_tree_links(tracker, parent, "digits", "3")
    base = f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs"
    view = "?workflowType=machine_learning"
    assert links == {
        "the pipeline's runs": f"{base}{view}",
        "best trial (trial 00 · lr=0.1)": f"{base}/{trial}{view}",
        "train run": f"{base}/{train}{view}",
        "evaluate run": f"{base}/{evaluate}{view}",
        "model digits version 3": "http://127.0.0.1:5000/#/models/digits/versions/3",
    }
    tracker.close_unfinished(parent, "KILLED")
