"""The ``trainflow`` command line (typer): run, config show, evaluate, predict."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trainflow.compare import compare as compare_command
from training.errors import ConfigError, TrainflowError

app = typer.Typer(
    help="trainflow: Ray Data -> Ray Tune (ASHA) -> Ray Train -> evaluation -> MLflow registry, "
    "orchestrated by Prefect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

console = Console(stderr=False)
errors = Console(stderr=True)

ConfigOption = typer.Option(
    None, "--config", "-c", help="YAML file of overrides (see configs/default.yaml)."
)
SetOption = typer.Option(
    None, "--set", "-s", help="Override one key, e.g. --set train.lr=0.01 (repeatable)."
)


def _fail(exc: BaseException | str, code: int = 1) -> None:
    errors.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(code)


def _load(config_file: Path | None, overrides: list[str] | None, **extra: Any):
    from training.config import load_config

    sets = list(overrides or [])
    sets += [f"{key}={value}" for key, value in extra.items() if value is not None]
    try:
        return load_config(config_file, sets)
    except TrainflowError as exc:
        _fail(exc, code=2)


@app.command()
def run(
    config_file: Path | None = ConfigOption,
    overrides: list[str] | None = SetOption,
    run_id: str | None = typer.Option(
        None,
        "--run-id",
        help="Name of this run; re-running with the same id resumes its sweep and training.",
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Resume the killed or failed run RUN_ID (same as --run-id RUN_ID)."
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Existing Ray cluster to use instead of a local instance."
    ),
    summary_json: Path | None = typer.Option(
        None, "--summary-json", help="Also write the run summary to this JSON file."
    ),
    deployment: str | None = typer.Option(
        None,
        "--deployment",
        "-d",
        help="Trigger a run of this deployment (nightly, smoke) on the stack's Prefect server "
        "instead of running here; --set overrides its config, --config replaces it.",
    ),
) -> None:
    """Run the whole pipeline: preprocess, sweep, train, evaluate, promote."""
    from trainflow.env import check_prefect_api, prepare_environment

    if resume and run_id and resume != run_id:
        _fail(f"--resume {resume} and --run-id {run_id} name different runs; give one", code=2)
    run_id = resume or run_id
    if deployment is not None:
        _trigger_deployment(deployment, config_file, overrides)
        return
    config = _load(config_file, overrides, **{"ray.address": ray_address})
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    try:
        check_prefect_api()
    except TrainflowError as exc:
        _fail(exc)
    from prefect.exceptions import TerminationSignal

    from flows.pipeline import pipeline
    from training import cluster

    again = f"; resume with `trainflow run --resume {run_id}`" if run_id else ""
    try:
        summary = pipeline(config=config, run_id=run_id)
    except TrainflowError as exc:
        _fail(exc)
    except BaseException as exc:
        # Ctrl-C / SIGTERM: KeyboardInterrupt, Prefect's TerminationSignal, or, inside Ray
        # calls, a SystemExit; the signal Ray's watcher recorded tells them apart.
        received = cluster.received_signal()
        if isinstance(exc, KeyboardInterrupt) or received == signal.SIGINT:
            errors.print(f"[bold red]interrupted[/]: MLflow runs were marked KILLED{again}")
            raise typer.Exit(130) from None
        if isinstance(exc, TerminationSignal) or received == signal.SIGTERM:
            errors.print(
                f"[bold red]terminated[/] (SIGTERM): MLflow runs were marked KILLED{again}"
            )
            raise typer.Exit(143) from None
        raise
    print_summary(summary)
    if summary_json is not None:
        import json

        summary_json.write_text(json.dumps(summary, indent=2, default=str))


def print_summary(summary: dict[str, Any]) -> None:
    from trainflow.render import summary_tables

    for table in summary_tables(summary):
        console.print(table)


@config_app.command("show")
def config_show(
    config_file: Path | None = ConfigOption, overrides: list[str] | None = SetOption
) -> None:
    """Print the resolved configuration (defaults + file + --set) as YAML."""
    import yaml

    config = _load(config_file, overrides)
    console.print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


def _model_state(config, model_uri: str) -> dict[str, Any]:
    from training.evaluate import load_model_state
    from training.tracking import registry, store

    local = Path(model_uri)
    if local.exists():
        return load_model_state(str(local))
    tracker = store.configure(config)
    return load_model_state(str(registry.model_files(tracker, model_uri)))


@app.command()
def evaluate(
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="models:/NAME@ALIAS, models:/NAME/VERSION, or a checkpoint directory.",
    ),
    config_file: Path | None = ConfigOption,
    overrides: list[str] | None = SetOption,
    split: str = typer.Option("test", help="Split to score: train, val or test."),
) -> None:
    """Score a model on a split of the configured data (preprocessing reused when cached)."""
    from trainflow.env import prepare_environment

    config = _load(config_file, overrides)
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    from training import cluster, data
    from training.evaluate import evaluate_state
    from training.storage import StorageLayout

    try:
        state = _model_state(config, model)
        cluster.connect(config.ray)
        endpoint = config.storage.endpoint_url
        files = data.resolve_inputs(config.data, endpoint)
        manifest = data.preprocess(
            config,
            StorageLayout.from_config(config),
            data.fingerprint(config.data, files, endpoint),
            files,
        )
        result = evaluate_state(state, manifest, split, endpoint_url=endpoint)
    except TrainflowError as exc:
        _fail(exc)
    finally:
        cluster.shutdown()
    table = Table(title=f"{model} on {split} ({int(result.metrics['test_rows'])} rows)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        table.add_row(key.replace("test_", f"{split}_"), f"{value:.4f}")
    console.print(table)


@app.command()
def predict(
    model: str = typer.Option(
        ..., "--model", "-m", help="models:/NAME@ALIAS, models:/NAME/VERSION, or a checkpoint."
    ),
    input_path: Path = typer.Option(
        ..., "--input", "-i", help="Parquet or CSV file/directory with the training's columns."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Parquet file to write."),
    config_file: Path | None = ConfigOption,
    overrides: list[str] | None = SetOption,
) -> None:
    """Predict labels for new rows; writes the input columns plus prediction and confidence."""
    from trainflow.env import prepare_environment

    config = _load(config_file, overrides)
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    from training import cluster, data
    from training.config import DataConfig
    from training.evaluate import predict_files

    try:
        state = _model_state(config, model)
        source = DataConfig(source=str(input_path.resolve()), label_column="__none__")
        files = data.resolve_inputs(source)
        fmt = data.input_format(source, files)
        cluster.connect(config.ray)
        rows = predict_files(state, files, str(output), fmt=fmt)
    except TrainflowError as exc:
        _fail(exc)
    finally:
        cluster.shutdown()
    console.print(f"wrote {rows} predictions to {output}")


app.command("compare")(compare_command)


# ------------------------------------------------------------------- the local stack (issue 3)

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


@app.command()
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
) -> None:
    """Start the local stack on 127.0.0.1: Prefect server, MLflow server, work pool, worker."""
    from deployments import stack
    from trainflow.env import prepare_environment

    prepare_environment(use_stack=False)
    options = stack.UpOptions(prefect_port, mlflow_port, pool, artifacts_destination, timeout)
    try:
        result = stack.up(options)
    except TrainflowError as exc:
        _fail(exc)
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
    console.print(f"  state and logs  {stack.stack_dir(Path(state.home))}")
    console.print("next: `trainflow deploy`, `trainflow status`, `trainflow down`")


@app.command()
def down() -> None:
    """Stop exactly the processes `trainflow up` started (by their recorded PIDs)."""
    from deployments import stack
    from trainflow.env import prepare_environment

    prepare_environment(use_stack=False)
    try:
        state, stopped = stack.down()
    except TrainflowError as exc:
        _fail(exc)
    if state is None:
        console.print("no stack is recorded in this home: nothing to stop")
        return
    pids = ", ".join(f"{name} {state.parts[name].pid}" for name in stopped) or "none running"
    console.print(f"stopped: {pids}")


@app.command()
def status(as_json: bool = JsonOption) -> None:
    """Health and URL of each part of the stack, the deployments and their next runs."""
    import json
    from dataclasses import asdict

    from deployments import stack
    from trainflow.env import prepare_environment

    prepare_environment(use_stack=False)
    try:
        state = stack.read_state()
    except TrainflowError as exc:
        _fail(exc)
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
            deployments = stack.deployments_overview(state.prefect_api_url)
        except TrainflowError as exc:
            problem = str(exc)
    healthy = all(p.healthy for p in parts) and len(parts) == len(stack.PARTS)
    if as_json:
        report = {
            "running": healthy,
            "parts": [asdict(p) for p in parts],
            "deployments": deployments,
            "prefect_api_url": state.prefect_api_url,
            "mlflow_url": state.mlflow_url,
        }
        console.print_json(json.dumps(report))
    else:
        _print_status(parts, deployments, problem)
    if not healthy:
        raise typer.Exit(1)


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
        errors.print(f"[bold red]error:[/] {problem}", highlight=False)
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


@app.command()
def deploy(
    pool: str | None = typer.Option(
        None, "--pool", help="Work pool (default: the running stack's pool)."
    ),
    names: list[str] | None = typer.Option(
        None, "--name", "-n", help="Only this deployment (repeatable): nightly, smoke."
    ),
) -> None:
    """Create or update the deployments (nightly, smoke) on the Prefect server, idempotently."""
    from deployments import stack
    from trainflow.env import check_prefect_api, prepare_environment

    prepare_environment()
    try:
        check_prefect_api()
        state = stack.running_state()
        from deployments.deploy import deploy_all

        deployed = deploy_all(pool or (state.pool if state else stack.DEFAULT_POOL), names)
    except TrainflowError as exc:
        _fail(exc)
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


def _trigger_deployment(name: str, config_file: Path | None, overrides: list[str] | None) -> None:
    """`trainflow run --deployment NAME`: validate any overrides here, then start the run on the
    stack's worker."""
    from trainflow.env import check_prefect_api, prepare_environment

    prepare_environment()
    try:
        check_prefect_api()
        from deployments import deploy as deployments
        from training.config import parse_override, validate_config

        deployments.require_api_url()
        config = None
        if config_file is not None:
            config = _load(config_file, overrides)
        elif overrides:
            base = validate_config(deployments.deployment_parameters(name))
            sets = dict(parse_override(item) for item in overrides)
            config = base.with_overrides(sets)
        run = deployments.trigger(
            name, config.model_dump(mode="json") if config is not None else None
        )
    except ConfigError as exc:
        _fail(exc, code=2)
    except TrainflowError as exc:
        _fail(exc)
    import os

    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    console.print(f"started flow run {run['name']} ({run['id']}) of pipeline/{name}")
    console.print(f"  follow it: {ui}/runs/flow-run/{run['id']}")


def main() -> None:  # pragma: no cover - `python -m trainflow`
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
