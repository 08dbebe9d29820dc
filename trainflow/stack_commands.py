"""The local stack's commands: ``trainflow up``, ``down``, ``status``, ``deploy``, and
``run --deployment`` (a run of a deployment on the stack's worker). cli.py registers them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from trainflow.output import console, print_error
from training.errors import TrainflowError

PrefectPortOption = typer.Option(
    4200,
    "--prefect-port",
    min=1,
    max=65535,
    help="Port of the Prefect server (API and UI) on 127.0.0.1.",
)
MlflowPortOption = typer.Option(
    5000,
    "--mlflow-port",
    min=1,
    max=65535,
    help="Port of the MLflow server (API and UI) on 127.0.0.1.",
)
PoolOption = typer.Option("trainflow", "--pool", help="Name of the Prefect process work pool.")
JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")


def up(
    prefect_port: int = PrefectPortOption,
    mlflow_port: int = MlflowPortOption,
    pool: str = PoolOption,
    artifacts_destination: str | None = typer.Option(
        None,
        "--artifacts-destination",
        envvar="TRAINFLOW_ARTIFACTS_DESTINATION",
        help="Where the MLflow server stores artifacts: default <home>/mlartifacts, or "
        "s3://bucket/prefix (credentials and AWS_ENDPOINT_URL from the environment).",
    ),
    timeout: float = typer.Option(
        180.0, "--timeout", help="Seconds to wait for every part to become healthy."
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address the servers listen on. Anything but loopback needs authentication: "
        "PREFECT_SERVER_API_AUTH_STRING=user:password and MLFLOW_TRACKING_USERNAME / "
        "MLFLOW_TRACKING_PASSWORD in the environment (docs/scale-out.md).",
    ),
) -> None:
    """Start the local stack (127.0.0.1 by default): Prefect server, MLflow server, work pool,
    worker."""
    from deployments import stack, stack_state
    from trainflow.env import prepare_environment

    prepare_environment(use_stack=False)
    options = stack.UpOptions(prefect_port, mlflow_port, pool, artifacts_destination, timeout, host)
    result = stack.up(options)
    state = result.state
    if result.already_running:
        console.print("the stack is already running (nothing started):")
    else:
        console.print(f"the stack is up in {result.seconds:.0f} s:")
    console.print(
        f"  Prefect UI/API  {state.prefect_url}   (PREFECT_API_URL={state.prefect_api_url})"
    )
    console.print(f"  MLflow UI/API   {state.mlflow_url}")
    worker = state.parts["worker"]
    console.print(f"  worker          pool {state.pool!r}, pid {worker.pid}")
    console.print(f"  state and logs  {stack_state.stack_dir(Path(state.home))}")
    if state.host != stack.HOST:
        console.print(f"  listening on    {state.host}, with authentication on both servers")
    console.print("next: `trainflow deploy`, `trainflow status`, `trainflow down`")


def down() -> None:
    """Stop exactly the processes `trainflow up` started (by their recorded PIDs)."""
    from deployments import stack
    from trainflow.env import prepare_environment

    prepare_environment(use_stack=False)
    state, stopped = stack.down()
    if state is None:
        console.print("no stack is recorded in this home: nothing to stop")
        return
    pids = ", ".join(f"{name} {state.parts[name].pid}" for name in stopped) or "none running"
    console.print(f"stopped: {pids}")


def status(as_json: bool = JsonOption) -> None:
    """Health and URL of each part of the stack, the deployments and their next runs."""
    import json
    from dataclasses import asdict

    from deployments import prefect_api, stack, stack_state
    from trainflow.env import prepare_environment

    prepare_environment(use_stack=False)
    state = stack_state.read_state()
    if state is None:
        if as_json:
            console.print_json(json.dumps({"running": False, "parts": [], "deployments": []}))
        else:
            console.print("no stack is running in this home; start it with `trainflow up`")
        raise typer.Exit(1)
    parts = stack.part_statuses(state)
    deployments: list[dict[str, Any]] = []
    problem = None
    if any(p.name == "prefect" and p.healthy for p in parts):
        try:
            deployments = prefect_api.deployments_overview(state.prefect_api_url)
        except TrainflowError as exc:
            problem = str(exc)
    healthy = all(p.healthy for p in parts) and len(parts) == len(stack.PARTS)
    experiments = _training_experiments(state, parts)
    if as_json:
        report = {
            "running": healthy,
            "parts": [asdict(p) for p in parts],
            "deployments": deployments,
            "prefect_api_url": state.prefect_api_url,
            "mlflow_url": state.mlflow_url,
            "mlflow_experiments": experiments,
        }
        console.print_json(json.dumps(report))
    else:
        _print_status(parts, deployments, problem)
        for name, url in experiments.items():
            console.print(f"MLflow runs of {name}: {url}", soft_wrap=True, highlight=False)
    if not healthy:
        raise typer.Exit(1)


def _training_experiments(state, parts) -> dict[str, str]:
    """The stack's model-training experiments and their runs in the MLflow UI's training view
    (MLflow 3 opens an experiment on its GenAI side otherwise); none while MLflow is down."""
    if not any(p.name == "mlflow" and p.healthy for p in parts):
        return {}
    from training.tracking import ui

    try:
        return ui.training_experiments(state.mlflow_url)
    except Exception:  # a status line must not fail the status
        return {}


def _print_status(parts, deployments, problem: str | None) -> None:
    table = Table(title="trainflow stack")
    for column in ("part", "state", "url", "pid", "log"):
        table.add_column(column)
    for part in parts:
        state = "[green]healthy[/]" if part.healthy else "[red]unhealthy[/]"
        if not part.running:
            state = "[red]not running[/]"
        table.add_row(part.name, state, part.url or "", str(part.pid), part.log)
    console.print(table)
    if problem:
        print_error(problem)
    if not deployments:
        console.print("no deployments yet: `trainflow deploy`")
        return
    table = Table(title="deployments")
    for column in ("deployment", "schedule", "state", "next runs"):
        table.add_column(column)
    for item in deployments:
        schedules = "; ".join(
            f"{s['schedule']} ({s['timezone'] or 'UTC'})" + ("" if s["active"] else " inactive")
            for s in item["schedules"]
        )
        table.add_row(
            f"pipeline/{item['name']}",
            schedules,
            "paused" if item["paused"] else "active",
            "\n".join(item["next_runs"]) or "-",
        )
    console.print(table)


def deploy(
    pool: str | None = typer.Option(
        None, "--pool", help="Work pool (default: the running stack's pool)."
    ),
    names: list[str] | None = typer.Option(
        None, "--name", "-n", help="Only this deployment (repeatable): nightly, smoke, score."
    ),
    overrides: list[str] | None = typer.Option(
        None,
        "--set",
        "-s",
        help="Override one key of the named deployment's config, e.g. --set "
        "data.source=s3://bucket/new/ (repeatable; deploying without it restores the file's).",
    ),
    cron: str | None = typer.Option(
        None,
        "--cron",
        help="The named deployment's schedule as a cron expression (in its timezone).",
    ),
    interval: float | None = typer.Option(
        None, "--interval", help="The named deployment's schedule: every this many seconds."
    ),
) -> None:
    """Create or update the deployments (nightly, smoke, score) on the Prefect server,
    idempotently. Paused ones stay paused: `trainflow schedule resume NAME`."""
    from deployments import stack, stack_state
    from deployments.deploy import deploy_all
    from trainflow.env import check_prefect_api, prepare_environment

    prepare_environment()
    check_prefect_api()
    state = stack_state.running_state()
    schedule = {"cron": cron, "interval_s": interval} if cron or interval is not None else None
    pool = pool or (state.pool if state else stack.DEFAULT_POOL)
    deployed = deploy_all(pool, names, list(overrides or []), schedule)
    table = Table(title="deployments (created or updated)")
    for column in ("deployment", "schedule", "timezone", "state"):
        table.add_column(column)
    for item in deployed:
        table.add_row(
            item["name"],
            item["schedule"],
            item["timezone"],
            "paused" if item["paused"] else "active",
        )
    console.print(table)
    console.print("run one now: `trainflow run --deployment smoke`; see them: `trainflow status`")


def trigger_deployment(name: str, config_file: Path | None, overrides: list[str] | None) -> None:
    """`trainflow run --deployment NAME`: validate any overrides here, then start the run on the
    stack's worker."""
    import os

    from deployments import deploy as deployments
    from trainflow.env import check_prefect_api, prepare_environment
    from training.config import validate_config
    from training.config.overrides import load_config, parse_override

    prepare_environment()
    check_prefect_api()
    deployments.require_api_url()
    config = None
    if config_file is not None:
        config = load_config(config_file, list(overrides or []))
    elif overrides:
        base = validate_config(deployments.deployment_parameters(name))
        sets = dict(parse_override(item) for item in overrides)
        config = base.with_overrides(sets)
    run = deployments.trigger(name, config.model_dump(mode="json") if config is not None else None)
    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    console.print(f"started flow run {run['name']} ({run['id']}) of pipeline/{name}")
    console.print(f"  follow it: {ui}/runs/flow-run/{run['id']}")
