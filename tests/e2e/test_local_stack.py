"""The local stack as a user runs it, on real servers and free ports in a temporary home:
`trainflow up`, `deploy`, a triggered `smoke` deployment run through the worker to COMPLETED, the
MLflow server's run tree and registry, `nightly`'s schedule, `status`, `up` twice, `down`.

Also: a run against an unreachable MLflow or S3 beside the running stack fails fast, and every
process `up` started listens on 127.0.0.1 only.

The stack is the session's (conftest.py: local_stack), shared with test_operations.py, which
runs first on the same pytest worker; this module uses the smoke config's experiment and model,
test_operations its own.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cli_runner import free_port, run_cli, run_log_of
from shared_stack import CANARIES

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMOKE = str(REPO_ROOT / "configs" / "smoke.yaml")
RUN_TIMEOUT_S = 480  # the smoke pipeline takes ~90 s on 2 cores; generous under CI load
FAIL_FAST_S = 60  # an unreachable service fails a run within a minute
S3_DETECTION_S = 45  # 3 attempts of the S3 check, 4 + ~10 s of retry delay between them


def closed_port() -> int:
    """A port that was just bound and closed: nothing listens there."""
    return free_port()


def trainflow(home: Path, *args: str, timeout: int = 300, **env: str):
    return run_cli(home, *args, timeout=timeout, **env)


def _json(request: urllib.request.Request | str):
    """The JSON answer; a busy server's 503 is asked again (as Prefect's own client does)."""
    for attempt in range(6):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or attempt == 5:
                raise
            time.sleep(2 * (attempt + 1))


def _get(url: str):
    return _json(url)


def _post(url: str, body: dict):
    return _json(
        urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
    )


def _pids_of_tree(pids: list[int]) -> list[int]:
    import psutil

    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found += [proc.pid] + [child.pid for child in proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return found


def _cmdline(pid: int) -> list[str]:
    import psutil

    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def stack(local_stack):
    """The session's `trainflow up` stack (conftest.py, shared with test_operations.py); this
    module's last test takes it down."""
    return local_stack


@pytest.fixture(scope="module")
def deployed(stack):
    proc = trainflow(stack["home"], "deploy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pipeline/nightly" in proc.stdout and "pipeline/smoke" in proc.stdout
    assert "pipeline/score" in proc.stdout
    return proc


def _trigger(home: Path, name: str, *overrides: str) -> str:
    """`trainflow run --deployment NAME [--set K=V ...]`: only triggers; returns the flow run's
    id."""
    proc = trainflow(home, "run", "--deployment", name, *overrides)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("(", 1)[1].split(")", 1)[0]


@pytest.fixture(scope="module")
def smoke_run(stack, deployed):
    """Two runs of the smoke deployment triggered back to back; the worker runs them meanwhile.
    The deployment's concurrency limit (1) makes the second wait for the first. The second only
    has to take the slot: no sweep, one epoch."""
    triggered = time.monotonic()
    first = _trigger(stack["home"], "smoke")
    second = _trigger(
        stack["home"], "smoke", "--set", "sweep.enabled=false", "--set", "train.max_epochs=1"
    )
    return {"id": first, "second_id": second, "triggered": triggered}


def test_up_records_parts_on_the_requested_ports(stack):
    state = stack["state"]
    assert set(state["parts"]) == {"prefect", "mlflow", "worker"}
    assert state["prefect_url"] == f"http://127.0.0.1:{stack['ports']['prefect']}"
    assert state["mlflow_url"] == f"http://127.0.0.1:{stack['ports']['mlflow']}"
    assert _get(f"{state['prefect_url']}/api/health") is True
    with urllib.request.urlopen(f"{state['mlflow_url']}/health", timeout=10) as response:
        assert response.read() == b"OK"
    # The MLflow server serves the embedded default's store, so earlier runs show up.
    assert f"sqlite:///{stack['home'] / 'mlflow.db'}" in state["parts"]["mlflow"]["command"]
    for part in state["parts"].values():
        assert _alive(part["pid"]), part
        assert Path(part["log"]).is_file()
    # The MLflow server alone, without MLflow's job runner and its consumer processes.
    commands = [" ".join(_cmdline(pid)) for pid in _pids_of_tree([state["parts"]["mlflow"]["pid"]])]
    assert not [c for c in commands if "huey" in c or "jobs._job_runner" in c], commands


def test_every_process_up_started_listens_on_loopback_only(stack):
    """The listening sockets of the servers, the worker and their children."""
    import psutil

    pids = set(_pids_of_tree([p["pid"] for p in stack["state"]["parts"].values()]))
    listening = [
        conn
        for conn in psutil.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids
    ]
    ports = {conn.laddr.port for conn in listening}
    assert {stack["ports"]["prefect"], stack["ports"]["mlflow"]} <= ports, listening
    assert all(conn.laddr.ip == "127.0.0.1" for conn in listening), listening


def test_up_twice_is_a_no_op(stack):
    before = stack["state"]
    proc = trainflow(stack["home"], "up")  # default ports: it must not even look at them
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already running" in proc.stdout
    assert stack["state"]["prefect_url"] in proc.stdout
    after = json.loads((stack["home"] / "stack" / "state.json").read_text())
    assert {k: p["pid"] for k, p in after["parts"].items()} == {
        k: p["pid"] for k, p in before["parts"].items()
    }


def test_unreachable_mlflow_fails_the_run_fast(stack):
    """MLflow at a closed port; Prefect is the running stack."""
    url = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    proc = trainflow(stack["home"], "run", "--config", SMOKE, MLFLOW_TRACKING_URI=url)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert elapsed < FAIL_FAST_S, elapsed
    assert url in proc.stderr and "trainflow up" in proc.stderr, proc.stderr[-2000:]


def test_unreachable_s3_endpoint_fails_the_run_fast(stack):
    """storage.endpoint_url at a closed port."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    proc = trainflow(
        stack["home"],
        "run",
        "--config",
        SMOKE,
        "--set",
        "storage.root=s3://trainflow-e2e/stack",
        "--set",
        f"storage.endpoint_url={endpoint}",
        "--set",
        "mlflow.experiment=trainflow-unreachable",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert endpoint in proc.stderr and "storage.endpoint_url" in proc.stderr, proc.stderr[-2000:]
    # What the run controls, from its log: the first stage's start to the flow's failure (three
    # attempts of the S3 check with the stage's retry delays), not the start-up before it,
    # which a busy CI machine stretched to 40 s. Without bounded retries this took minutes.
    detected = _seconds_between(
        run_log_of(proc).read_text(errors="replace"),
        "preprocess: [1/5] started",
        "Finished in state",
    )
    assert detected < S3_DETECTION_S, detected
    assert elapsed < 3 * FAIL_FAST_S, elapsed  # and no hang anywhere else


def _seconds_between(log: str, first: str, last: str) -> float:
    """Seconds from the first line containing ``first`` to the last containing ``last``
    (Prefect's "HH:MM:SS.fff |" stamps)."""

    def stamp(line: str) -> float:
        hours, minutes, seconds = line.split(" | ", 1)[0].split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)

    lines = [line for line in log.splitlines() if re.match(r"\d\d:\d\d:\d\d\.\d+ \|", line)]
    start = next(line for line in lines if first in line)
    end = [line for line in lines if last in line][-1]
    return stamp(end) - stamp(start)


@pytest.fixture(scope="module")
def smoke_finished(stack, smoke_run):
    """The triggered run's final state, polled (bounded) through the Prefect API."""
    api = f"{stack['state']['prefect_url']}/api"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        flow_run = _get(f"{api}/flow_runs/{smoke_run['id']}")
        if flow_run["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            break
        assert time.monotonic() < deadline, f"still {flow_run['state_type']} after the deadline"
        time.sleep(2)
    seconds = time.monotonic() - smoke_run["triggered"]
    print(f"\nsmoke deployment run: trigger to {flow_run['state_type']} in {seconds:.1f} s")
    return flow_run


@pytest.fixture(scope="module")
def second_smoke_finished(stack, smoke_run, smoke_finished):
    api = f"{stack['state']['prefect_url']}/api"
    return _final_state(api, smoke_run["second_id"], timeout_s=RUN_TIMEOUT_S)


def _states(api: str, flow_run_id: str) -> list[dict]:
    return sorted(
        _get(f"{api}/flow_run_states/?flow_run_id={flow_run_id}"), key=lambda s: s["timestamp"]
    )


def test_runs_of_one_deployment_never_overlap(
    stack, smoke_run, smoke_finished, second_smoke_finished
):
    """The deployments' concurrency limit of 1 (Prefect's own, collision strategy
    ENQUEUE): the second run, triggered while the first ran, waits for the slot and starts only
    after the first has finished; both complete."""
    api = f"{stack['state']['prefect_url']}/api"
    assert smoke_finished["state_type"] == second_smoke_finished["state_type"] == "COMPLETED"
    # The worker picks both up at once; either may win the slot: the other waits for it.
    first, second = sorted(
        (smoke_finished, second_smoke_finished), key=lambda run: run["start_time"]
    )
    assert first["end_time"] <= second["start_time"], (first["end_time"], second["start_time"])
    waited = [s["name"] for s in _states(api, second["id"])]
    assert "AwaitingConcurrencySlot" in waited, waited
    deployment = _get(f"{api}/deployments/{first['deployment_id']}")
    # Prefect 3.8 answers with the limit as a global concurrency limit of its own.
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "ENQUEUE"


def test_no_canary_reaches_the_stack_logs_or_its_home(stack, second_smoke_finished):
    """With canaries in the environment of `up`, the servers' and the worker's logs,
    the flow runs' logs, both databases and every other file under the home hold none."""
    home = stack["home"]
    secrets = [value.encode() for value in CANARIES.values()]
    logs = list((home / "stack" / "logs").iterdir())
    assert {p.name for p in logs} >= {"prefect-server.log", "mlflow-server.log", "worker.log"}
    ray_root = (home / "ray").resolve()
    files = [p for p in [*home.rglob("*"), *ray_root.rglob("*")] if p.is_file()]
    leaks = [f"{p}: {s.decode()}" for p in files for s in secrets if s in p.read_bytes()]
    assert leaks == []


def test_smoke_deployment_run_completes_on_the_stack(stack, smoke_finished):
    flow_run = smoke_finished
    assert flow_run["state_type"] == "COMPLETED", flow_run["state"]
    api = f"{stack['state']['prefect_url']}/api"
    deployment = _get(f"{api}/deployments/{flow_run['deployment_id']}")
    assert deployment["name"] == "smoke"
    # The run's parameter is the smoke config, validated and whole.
    assert flow_run["parameters"]["config"]["sweep"]["num_samples"] == 4


def test_mlflow_server_has_the_run_tree_and_a_registered_version(stack, smoke_run, smoke_finished):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=stack["state"]["mlflow_url"])
    experiment = client.get_experiment_by_name("trainflow-smoke")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    parents = [r for r in runs if r.data.tags.get("prefect.flow_run_id") == smoke_run["id"]]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["trainflow.stage"] == "pipeline"
    assert parent.info.status == "FINISHED"
    # This run's tree only: the second run of the deployment (the concurrency test) has its own.
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    stages = {}
    for run in children:
        stages.setdefault(run.data.tags.get("trainflow.stage"), []).append(run)
    assert len(stages["train"]) == 1 and len(stages["sweep"]) == 1
    sweep = stages["sweep"][0]
    stages["trial"] = [r for r in runs if r.data.tags.get("trainflow.stage") == "trial"]
    trials = [r for r in stages["trial"] if r.data.tags["mlflow.parentRunId"] == sweep.info.run_id]
    assert len(trials) == 4
    versions = client.search_model_versions("name = 'digits-smoke'")
    assert len(versions) >= 1  # the second run of the deployment may have registered its own
    assert versions[0].run_id in {r.info.run_id for r in runs}


def _final_state(api: str, flow_run_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        flow_run = _get(f"{api}/flow_runs/{flow_run_id}")
        if flow_run["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            return flow_run
        assert time.monotonic() < deadline, f"still {flow_run['state_type']} after the deadline"
        time.sleep(2)


def test_bad_parameters_on_a_deployment_run_fail_fast(stack, deployed, smoke_finished):
    import copy
    import urllib.error

    api = f"{stack['state']['prefect_url']}/api"
    smoke = _get(f"{api}/deployments/name/pipeline/smoke")
    create = f"{api}/deployments/{smoke['id']}/create_flow_run"

    # A value the schema forbids: the server refuses the run, nothing starts.
    bad = copy.deepcopy(smoke["parameters"])
    bad["config"]["train"]["lr"] = -1
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(create, {"parameters": bad})
    assert refused.value.code in (409, 422)
    assert "lr" in refused.value.read().decode()

    # A cross-field rule: the flow validates the config before its first task.
    bad = copy.deepcopy(smoke["parameters"])
    bad["config"]["sweep"]["asha"]["grace_period"] = 9
    flow_run = _post(create, {"parameters": bad})
    final = _final_state(api, flow_run["id"], timeout_s=240)
    assert final["state_type"] == "FAILED", final["state"]
    assert "grace_period" in final["state"]["message"], final["state"]
    tasks = _post(f"{api}/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
    assert tasks == []

    # The CLI checks overrides of a deployment's config before it triggers anything.
    proc = trainflow(stack["home"], "run", "--deployment", "smoke", "--set", "train.lr=-1")
    assert proc.returncode == 2
    assert "train.lr" in proc.stderr and "greater than 0" in proc.stderr


def test_nightly_has_its_cron_and_next_runs(stack, deployed):
    api = f"{stack['state']['prefect_url']}/api"
    nightly = _get(f"{api}/deployments/name/pipeline/nightly")
    schedule = nightly["schedules"][0]["schedule"]
    assert schedule["cron"] == "0 2 * * *"
    assert schedule["timezone"] == "Europe/Berlin"
    assert nightly["paused"] is False
    assert nightly["parameters"]["config"]["train"]["max_epochs"] == 20  # configs/default.yaml
    assert nightly["work_pool_name"] == stack["state"]["pool"]
    assert nightly["entrypoint"] == "flows/pipeline.py:pipeline"
    smoke = _get(f"{api}/deployments/name/pipeline/smoke")
    assert smoke["paused"] is True
    assert smoke["schedules"][0]["schedule"]["interval"] == 6 * 3600
    # Paused on its cron, as deploying restores it after test_operations ran it every minute.
    score = _get(f"{api}/deployments/name/pipeline/score")
    assert score["paused"] is True
    assert [s["schedule"]["cron"] for s in score["schedules"]] == ["0 6 * * *"]
    assert score["entrypoint"] == "flows/score.py:score"

    proc = trainflow(stack["home"], "status", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = json.loads(proc.stdout)
    assert status["running"] is True
    assert all(part["healthy"] for part in status["parts"])
    by_name = {d["name"]: d for d in status["deployments"]}
    assert len(by_name["nightly"]["next_runs"]) >= 1
    # 02:00 in Berlin is 01:00 (winter) or 00:00 (summer) UTC.
    assert by_name["nightly"]["next_runs"][0][11:19] in {"01:00:00", "00:00:00"}
    assert by_name["smoke"]["next_runs"] == []  # paused: nothing scheduled


def test_redeploy_is_idempotent(stack, deployed, smoke_finished):
    api = f"{stack['state']['prefect_url']}/api"
    before = {d["name"]: d["id"] for d in _post(f"{api}/deployments/filter", {})}
    proc = trainflow(stack["home"], "deploy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = {d["name"]: d["id"] for d in _post(f"{api}/deployments/filter", {})}
    assert after == before


def test_prefect_ui_on_a_port_other_than_4200_shows_the_flow_run(stack, smoke_finished):
    """The UI's /ui-settings announces the API on the port `up` was given (it
    said 127.0.0.1:4200 whatever the port), and in a fresh headless Chromium the flow run's page
    loads from it instead of "Can't connect to Server API"."""
    import os

    prefect_url = stack["state"]["prefect_url"]
    assert stack["ports"]["prefect"] != 4200
    settings = _get(f"{prefect_url}/ui-settings")
    assert settings["api_url"] == f"http://127.0.0.1:{stack['ports']['prefect']}/api"
    # The flow run's artifacts: the trials table, links to the MLflow run and model version.
    api = f"{prefect_url}/api"
    artifacts = _post(
        f"{api}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [smoke_finished["id"]]}}}
    )
    by_key = {a["key"]: a for a in artifacts}
    assert by_key["trainflow-trials"]["type"] == "table"
    trials = by_key["trainflow-trials"]["data"]
    trials = json.loads(trials) if isinstance(trials, str) else trials
    assert len(trials) == 4 and {"trial", "train.lr", "epochs", "fate"} <= set(trials[0])
    mlflow_url = stack["state"]["mlflow_url"]
    # Prefect 3 keeps a link artifact as a markdown link: [text](url)
    run_link = by_key["trainflow-mlflow-run"]["data"]
    assert re.fullmatch(rf"\[MLflow run pipeline-\w+\]\({re.escape(mlflow_url)}/#/\S+\)", run_link)
    assert "workflowType=machine_learning" in run_link
    version_link = by_key["trainflow-model-version"]["data"]
    assert f"({mlflow_url}/#/models/digits-smoke/versions/" in version_link
    # `status` links the experiment's runs in the MLflow UI's training view.
    proc = trainflow(stack["home"], "status", "--json")
    runs_link = json.loads(proc.stdout)["mlflow_experiments"]["trainflow-smoke"]
    assert runs_link.startswith(stack["state"]["mlflow_url"] + "/#/experiments/")
    assert runs_link.endswith("/runs?workflowType=machine_learning")
    chromium = "/usr/bin/chromium"
    if not Path(chromium).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{chromium} is missing in CI: .ci/run must install Debian's chromium")
        pytest.skip(f"{chromium} is missing (apt-get install chromium); runs in CI")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.set_default_timeout(60_000)
            asked = []
            page.on("request", lambda request: asked.append(request.url))
            page.goto(f"{prefect_url}/runs/flow-run/{smoke_finished['id']}")
            page.get_by_text(smoke_finished["name"]).first.wait_for()
            shots = REPO_ROOT / "test-output" / "prefect-ui"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "01-flow-run.png"))
            assert page.get_by_text("Can't connect to Server API").count() == 0
            assert not [url for url in asked if ":4200/" in url]
            page.get_by_text("Artifacts", exact=True).first.click()
            page.get_by_text("trainflow-trials").first.wait_for()
            page.screenshot(path=str(shots / "02-flow-run-artifacts.png"))
        finally:
            browser.close()


def test_down_stops_every_started_process(stack, smoke_finished):
    pids = _pids_of_tree([p["pid"] for p in stack["state"]["parts"].values()])
    assert pids
    proc = trainflow(stack["home"], "down", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(_alive(pid) for pid in pids), [pid for pid in pids if _alive(pid)]
    assert not (stack["home"] / "stack" / "state.json").exists()
    again = trainflow(stack["home"], "down")
    assert again.returncode == 0 and "nothing to stop" in again.stdout
