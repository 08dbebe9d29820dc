"""Operations on the stack, end to end on `trainflow up` (free ports).

Told when it matters: `trainflow notify` points at a webhook receiver on 127.0.0.1 with a secret
from the environment; a pipeline run that fails and a run that moves the champion each reach the
receiver through the Prefect server's automations (its triggers and actions services), with the
flow, the state and the model version in the payload and the secret only in the request's
Authorization header.

Scheduled scoring: `pipeline/score` (deployed paused on its cron by default: test_local_stack)
is deployed on a short interval with the table and the model to score, then resumed (`trainflow
schedule resume`): the server's scheduler makes a run and the worker scores the table with the
champion the promoting run made, beside the input, with its version; `trainflow schedule pause`
drops the runs left.

Rollback: `trainflow rollback` moving the champion sends the same message as a promotion.

The stack is the session's (conftest.py: local_stack), shared with test_local_stack.py, which
runs after this module on the same pytest worker and takes it down: this module's runs use an
experiment and a registered model of their own (OWN), and the notifications are removed again.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_runner import free_port, run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECRET = "notify-canary-secret-4e1a9c"
# This module's experiment and model on the shared stack (test_local_stack uses the smoke config's).
EXPERIMENT = "trainflow-operations"
MODEL = "digits-operations"
OWN = ["--set", f"mlflow.experiment={EXPERIMENT}", "--set", f"mlflow.registered_model={MODEL}"]
HOOK_PATH = "/hooks/T0-notify-path-canary"
# An automation acts within seconds of the event; a busy 2-core machine gets a margin.
DELIVERY_TIMEOUT_S = 120
# A flow run on the worker: a new process imports the pipeline and starts Ray (~60 s on 2 cores).
SCORE_TIMEOUT_S = 420
# The score deployment's schedule in the test: every minute. The run after the first is due a
# minute later, time enough to pause the schedule before the worker fetches it.
SCHEDULE_S = 60
# The first scheduled run is due within SCHEDULE_S; the worker polls every 10 s; CLI start-up.
SCHEDULED_START_TIMEOUT_S = 240


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every request (path, headers, JSON)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                received.append({"path": self.path, "headers": dict(self.headers), "raw": raw})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}{HOOK_PATH}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def messages(self) -> list[dict]:
        """Each request's JSON body, with its ``body`` (itself JSON) parsed."""
        out = []
        for request in list(self.requests):
            data = json.loads(request["raw"])
            out.append({**request, "subject": data["subject"], "body": json.loads(data["body"])})
        return out

    def wait_for(self, event: str, timeout_s: float = DELIVERY_TIMEOUT_S, **fields) -> dict:
        """The last message of ``event`` whose body has ``fields``, waited for."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [
                m
                for m in self.messages()
                if m["body"]["event"] == event
                and all(m["body"].get(k) == v for k, v in fields.items())
            ]
            if found:
                return found[-1]
            time.sleep(1)
        raise AssertionError(f"no {event!r} message in {timeout_s} s; got {self.requests}")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    found = Receiver()
    yield found
    found.stop()


@pytest.fixture(scope="module")
def stack(local_stack):
    """The session's `trainflow up` stack (conftest.py): its home."""
    return local_stack["home"]


@pytest.fixture(scope="module")
def notified(stack, receiver):
    proc = run_cli(
        stack,
        "notify",
        "--webhook",
        receiver.url,
        "--secret-from-env",
        "HOOK_SECRET",
        HOOK_SECRET=SECRET,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield proc
    # test_local_stack's failing runs come next on this stack: no messages to a stopped receiver.
    removed = run_cli(stack, "notify", "--off")
    assert removed.returncode == 0, removed.stdout + removed.stderr


def test_notify_sets_up_without_printing_the_secret_or_the_path(notified, receiver):
    out = notified.stdout + notified.stderr
    assert "automation 'trainflow: a pipeline run failed'" in out
    assert "automation 'trainflow: the champion moved'" in out
    assert receiver.url.removesuffix(HOOK_PATH) in out
    assert HOOK_PATH not in out and SECRET not in out


def test_a_failing_run_reaches_the_webhook(stack, notified, receiver):
    started = time.monotonic()
    # A label the bundled data lacks: found inside the flow (a local file's columns are checked
    # before any flow run starts, and would make no flow run to fail).
    proc = run_cli(
        stack, "run", "--config", SMOKE, *OWN, "--set", "data.label_column=no_such_column"
    )
    assert proc.returncode != 0
    message = receiver.wait_for("flow-run-failed")
    print(f"\nfailure message {time.monotonic() - started:.1f} s after the run started")
    body = message["body"]
    assert body["flow"] == "pipeline" and body["state"] in ("Failed", "Crashed"), body
    assert body["flow_run"] and body["flow_run_id"]
    assert message["path"] == HOOK_PATH
    assert message["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert "pipeline run" in message["subject"]


@pytest.fixture(scope="module")
def promoted(stack, notified):
    """A smoke run on the stack: its version becomes the champion."""
    summary_file = stack / "summary.json"
    proc = run_cli(stack, "run", "--config", SMOKE, *OWN, "--summary-json", str(summary_file))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(summary_file.read_text())["model"]


def test_a_promoting_run_reaches_the_webhook_with_its_version(promoted, receiver):
    model = promoted
    assert model["name"] == MODEL
    assert model["decision"] in ("first-model", "promoted")
    message = receiver.wait_for("champion-moved", version=model["version"])
    body = message["body"]
    assert body["flow"] == "pipeline" and body["state"] == "Running"
    assert body["model"] == model["name"] and body["version"] == model["version"]
    assert body["decision"] == model["decision"]
    assert f"champion is now version {model['version']}" in message["subject"]
    assert message["headers"]["Authorization"] == f"Bearer {SECRET}"


def _api(home: Path) -> str:
    state = json.loads((home / "stack" / "state.json").read_text())
    return state["prefect_url"].rstrip("/") + "/api"


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _final_state(api: str, flow_run_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _get(f"{api}/flow_runs/{flow_run_id}")["state"]
        if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state
        time.sleep(3)
    raise AssertionError(f"flow run {flow_run_id} did not finish in {timeout_s} s: {state}")


def _post(url: str, body: dict):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _runs_of(api: str, deployment_id: str, **flow_runs) -> list[dict]:
    body = {"deployments": {"id": {"any_": [deployment_id]}}, "flow_runs": flow_runs}
    return _post(f"{api}/flow_runs/filter", body)


def _first_started(api: str, deployment_id: str, timeout_s: float) -> dict:
    """The deployment's first run that left the Scheduled state (the worker took it)."""
    left = {"state": {"type": {"any_": ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CRASHED"]}}}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = _runs_of(api, deployment_id, **left)
        if runs:
            return min(runs, key=lambda run: run["expected_start_time"])
        time.sleep(2)
    raise AssertionError(f"no run of the score deployment started in {timeout_s} s")


def test_the_score_schedule_fires_and_the_worker_scores_beside_the_input(stack, promoted):
    """`pipeline/score` runs from the Prefect worker on a schedule."""
    import pandas as pd
    import pyarrow.parquet as pq

    from training.data.builtin import digits

    pixels, _ = digits()
    incoming = stack / "incoming"
    incoming.mkdir()
    source = incoming / "new.parquet"
    pd.DataFrame({f"pixel_{i:02d}": pixels[:200, i] for i in range(64)}).to_parquet(source)
    proc = run_cli(
        stack, "deploy", "--name", "score", "--interval", str(SCHEDULE_S), *OWN,
        "--set", f"data.source={source}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = _api(stack)
    deployment = _get(f"{api}/deployments/name/pipeline/score")
    assert deployment["paused"] is True  # deploying never resumes it
    assert [s["schedule"]["interval"] for s in deployment["schedules"]] == [SCHEDULE_S]
    config = deployment["parameters"]["config"]
    assert config["data"]["source"] == str(source)
    assert config["mlflow"]["registered_model"] == MODEL

    resumed = run_cli(stack, "schedule", "resume", "score")
    try:
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert _get(f"{api}/deployments/{deployment['id']}")["paused"] is False
        run = _first_started(api, deployment["id"], SCHEDULED_START_TIMEOUT_S)
    finally:
        paused = run_cli(stack, "schedule", "pause", "score")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    assert "paused" in paused.stdout
    assert _get(f"{api}/deployments/{deployment['id']}")["paused"] is True
    assert _runs_of(api, deployment["id"], state={"name": {"any_": ["Scheduled"]}}) == []
    # Made by the server's scheduler from the deployment's schedule, not triggered by hand.
    assert run["auto_scheduled"] is True, run
    state = _final_state(api, run["id"], SCORE_TIMEOUT_S)
    assert state["type"] == "COMPLETED", state
    version = promoted["version"]
    out = pq.read_table(incoming / f"new.scored-v{version}.parquet").to_pandas()
    assert len(out) == 200 and set(out["model_version"]) == {version}
    assert "prediction" in out


def _second_version(stack: Path, promoted: dict) -> str:
    """Another evaluated version of the model, registered from the champion's own model (test
    set-up through the registry; no second pipeline run): what a rollback may move to."""
    from mlflow import MlflowClient

    state = json.loads((stack / "stack" / "state.json").read_text())
    client = MlflowClient(tracking_uri=state["mlflow_url"], registry_uri=state["mlflow_url"])
    champion = client.get_model_version(MODEL, promoted["version"])
    tags = {k: v for k, v in champion.tags.items() if k.startswith(("test_", "gate."))}
    # MLflow 3: a version of a logged model (source models:/m-...) names that model's id.
    model_id = champion.source.removeprefix("models:/")
    other = client.create_model_version(
        MODEL, champion.source, run_id=champion.run_id, tags=tags, model_id=model_id
    )
    return str(other.version)


def test_a_rollback_reaches_the_webhook_like_a_promotion(stack, promoted, notified, receiver):
    """`trainflow rollback` moving the champion is told like a promotion."""
    target = _second_version(stack, promoted)
    why = "rollback drill: the newer version misroutes refunds"
    # The experiment too: the command reads the registry through the config's tracking store.
    proc = run_cli(stack, "rollback", MODEL, "--to", target, "--why", why, *OWN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"to version {target}" in proc.stdout
    message = receiver.wait_for("champion-moved", decision="rollback")
    body = message["body"]
    assert body["model"] == MODEL and body["version"] == target
    assert body["previous"] == promoted["version"] and body["reason"] == why
    assert body["by"] and body["metric"] and body["value"] is not None
    assert body["flow"] is None and body["flow_run"] is None  # the command, not a flow run
    assert f"{MODEL} champion is now version {target}" in message["subject"]
    assert message["path"] == HOOK_PATH
    assert message["headers"]["Authorization"] == f"Bearer {SECRET}"


def test_no_secret_in_any_log_or_artifact(stack, receiver):
    """The secret lives in the Prefect block (the server keeps block secrets encrypted in its
    database): no log, MLflow artifact or other file under the home holds it."""
    leaks = []
    for path in stack.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if SECRET.encode() in path.read_bytes():
                    leaks.append(str(path))
            except OSError:
                continue
    assert leaks == []
