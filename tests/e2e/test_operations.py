"""Operations on the stack (issue 32, items 6 and 7), end to end on `trainflow up` (free ports).

Told when it matters: `trainflow notify` points at a webhook receiver on 127.0.0.1 with a secret
from the environment; a pipeline run that fails and a run that moves the champion each reach the
receiver through the Prefect server's automations (its triggers and actions services), with the
flow, the state and the model version in the payload and the secret only in the request's
Authorization header.

Scheduled scoring: `pipeline/score` is deployed paused on its cron; a run of it on the worker
scores a table with the champion the promoting run made, beside the input, with its version.
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
HOOK_PATH = "/hooks/T0-notify-path-canary"
# An automation acts within seconds of the event; a busy 2-core machine gets a margin.
DELIVERY_TIMEOUT_S = 120
# A flow run on the worker: a new process imports the pipeline and starts Ray (~60 s on 2 cores).
SCORE_TIMEOUT_S = 420


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

    def wait_for(self, event: str, timeout_s: float = DELIVERY_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [m for m in self.messages() if m["body"]["event"] == event]
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
def stack(tmp_path_factory):
    """`trainflow up` on free ports; `trainflow down` at the end whatever happened."""
    home = tmp_path_factory.mktemp("notify-home")
    ports = [free_port(), free_port()]
    proc = run_cli(
        home, "up", "--prefect-port", str(ports[0]), "--mlflow-port", str(ports[1]),
        "--timeout", "240", timeout=300,
    )  # fmt: skip
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield home
    finally:
        if (home / "stack" / "state.json").exists():
            run_cli(home, "down", timeout=120)


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
    return proc


def test_notify_sets_up_without_printing_the_secret_or_the_path(notified, receiver):
    out = notified.stdout + notified.stderr
    assert "automation 'trainflow: a pipeline run failed'" in out
    assert "automation 'trainflow: the champion moved'" in out
    assert receiver.url.removesuffix(HOOK_PATH) in out
    assert HOOK_PATH not in out and SECRET not in out


def test_a_failing_run_reaches_the_webhook(stack, notified, receiver):
    started = time.monotonic()
    proc = run_cli(stack, "run", "--config", SMOKE, "--set", "data.source=/no/such/table.parquet")
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
    proc = run_cli(stack, "run", "--config", SMOKE, "--summary-json", str(summary_file))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(summary_file.read_text())["model"]


def test_a_promoting_run_reaches_the_webhook_with_its_version(promoted, receiver):
    model = promoted
    assert model["decision"] in ("first-model", "promoted")
    message = receiver.wait_for("champion-moved")
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


def test_the_score_deployment_scores_beside_the_input_on_the_worker(stack, promoted):
    proc = run_cli(stack, "deploy", "--name", "score")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pipeline/score" in proc.stdout
    api = _api(stack)
    deployment = _get(f"{api}/deployments/name/pipeline/score")
    assert deployment["paused"] is True
    assert [s["schedule"]["cron"] for s in deployment["schedules"]] == ["0 6 * * *"]

    import pandas as pd
    import pyarrow.parquet as pq

    from training.data.builtin import digits

    pixels, _ = digits()
    incoming = stack / "incoming"
    incoming.mkdir()
    frame = pd.DataFrame({f"pixel_{i:02d}": pixels[:200, i] for i in range(64)})
    frame.to_parquet(incoming / "new.parquet")
    proc = run_cli(
        stack, "run", "--deployment", "score",
        "--set", f"mlflow.registered_model={promoted['name']}",
        "--set", f"data.source={incoming / 'new.parquet'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flow_run_id = proc.stdout.split("(", 1)[1].split(")", 1)[0]
    state = _final_state(api, flow_run_id, SCORE_TIMEOUT_S)
    assert state["type"] == "COMPLETED", state
    version = promoted["version"]
    out = pq.read_table(incoming / f"new.scored-v{version}.parquet").to_pandas()
    assert len(out) == 200 and set(out["model_version"]) == {version}
    assert "prediction" in out


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
