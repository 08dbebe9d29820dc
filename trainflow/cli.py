"""The ``trainflow`` command line (typer): run, config show, evaluate, predict, compare, the
local stack's commands (stack_commands.py) and the champion's history and rollback
(champion_commands.py). Errors are reported in one place: output.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from trainflow import (
    champion_commands,
    inspect_command,
    interrupts,
    notify_commands,
    stack_commands,
    startup,
)
from trainflow.compare import compare as compare_command
from trainflow.flow_call import run_flow
from trainflow.output import ReportingGroup, console
from trainflow.progress_view import ProgressView
from trainflow.render import summary_lines
from trainflow.runlog import CommandLog, logged_to_file
from trainflow.schedule_commands import app as schedule_app
from training.errors import ConfigError
from training.metrics import is_count
from training.report.trials import fmt_metric

if TYPE_CHECKING:
    from training.summary import RunSummary

app = typer.Typer(
    cls=ReportingGroup,
    help="trainflow: Ray Data -> Ray Tune (ASHA) -> Ray Train -> evaluation -> MLflow registry, "
    "orchestrated by Prefect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

ConfigOption = typer.Option(
    None, "--config", "-c", help="YAML file of overrides (see configs/default.yaml)."
)
SetOption = typer.Option(
    None, "--set", "-s", help="Override one key, e.g. --set train.lr=0.01 (repeatable)."
)
VerboseOption = typer.Option(
    False, "--verbose", "-v", help="Also stream the libraries' log (Ray, Prefect, MLflow) here."
)


def _load(config_file: Path | None, overrides: list[str] | None, **extra: Any):
    from training.config.overrides import load_config

    sets = list(overrides or [])
    sets += [f"{key}={value}" for key, value in extra.items() if value is not None]
    return load_config(config_file, sets)


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
        help="Trigger a run of this deployment (nightly, smoke, score) on the stack's Prefect "
        "server instead of running here; --set overrides its config, --config replaces it.",
    ),
    verbose: bool = VerboseOption,
) -> None:
    """Run the whole pipeline: preprocess, sweep, train, evaluate, promote."""
    from trainflow.env import check_prefect_api, prepare_environment
    from training.storage import trainflow_home

    if resume and run_id and resume != run_id:
        raise ConfigError(f"--resume {resume} and --run-id {run_id} name different runs; give one")
    run_id = resume or run_id
    if deployment is not None:
        stack_commands.trigger_deployment(deployment, config_file, overrides)
        return
    config = _load(config_file, overrides, **{"ray.address": ray_address})
    # Bad data or a bad model fails fast, before anything starts.
    from training.stages.preflight import check_data_now, check_model_now

    check_data_now(config)
    if config.model.kind in ("custom", "hf"):
        check_model_now(config)
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    check_prefect_api()
    with CommandLog(trainflow_home(), "run", verbose) as log, interrupts.reported(run_id):
        console.print(
            f"trainflow run: libraries log to {log.path}", highlight=False, soft_wrap=True
        )
        with ProgressView(console, live=log.interactive and not verbose):
            summary = _run_pipeline(config, run_id)
        for line in summary_lines(summary, str(log.path)):
            console.print(line, highlight=False, soft_wrap=True)
        if summary_json is not None:
            import json

            summary_json.write_text(json.dumps(summary.to_dict(), indent=2, default=str))


def _run_pipeline(config, run_id: str | None) -> RunSummary:
    """Ray and Prefect's temporary server start, each in a thread, while the pipeline is
    imported (trainflow/startup.py); then the flow runs."""
    from training.platform import cluster

    # A local Ray instance first (the longest start; the server's constructor imports Prefect's
    # server for ~3 s): the first stage finds it up.
    ship = []
    # A custom model's package (and a training function's) travels to the workers unless
    # installed.
    if config.model.kind == "custom":
        from training.model.factory import ship_paths

        ship = ship_paths(config.model, config.train.function)
    startup.start_ray_early(config.ray, ship)
    try:
        return run_flow(config, run_id, startup.start_prefect_early())
    finally:
        cluster.shutdown()  # the flow stops Ray itself; not if it failed before its body ran


@config_app.command("show")
def config_show(
    config_file: Path | None = ConfigOption, overrides: list[str] | None = SetOption
) -> None:
    """Print the resolved configuration (defaults + file + --set) as YAML."""
    import yaml

    config = _load(config_file, overrides)
    console.print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


def _model_files(config, model_uri: str) -> tuple[dict[str, bytes], list[Any]]:
    """The model's files (packed for Ray workers) and its classes, resolved by the flavour."""
    from training.tracking import flavour

    packed = flavour.resolve(config, model_uri)
    return packed.files, packed.classes


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
    verbose: bool = VerboseOption,
) -> None:
    """Score a model on a split of the configured data (preprocessing reused when cached)."""
    from trainflow.env import prepare_environment

    config = _load(config_file, overrides)
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    from training.storage import StorageLayout, trainflow_home

    # Ray Data's and MLflow's lines (importing the model module warns) go to the log file.
    with logged_to_file(trainflow_home(), "evaluate", verbose):
        from training.data.inputs import fingerprint, resolve_inputs
        from training.data.preprocess import preprocess
        from training.inference.evaluate import evaluate_model
        from training.platform import cluster

        try:
            files_of_model, classes = _model_files(config, model)
            cluster.connect(config.ray)
            endpoint = config.storage.endpoint_url
            files = resolve_inputs(config.data, endpoint)
            manifest = preprocess(
                config,
                StorageLayout.from_config(config),
                fingerprint(config.data, files, endpoint, config.model),
                files,
            )
            result, _ = evaluate_model(
                files_of_model, classes, manifest, split, endpoint, config.train.use_gpu
            )
        finally:
            cluster.shutdown()
    table = Table(title=f"{model} on {split} ({int(result.metrics['test_rows'])} rows)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        shown = fmt_metric(value, key) if is_count(key) else f"{value:.4f}"
        table.add_row(key.replace("test_", f"{split}_"), shown)
    console.print(table)


@app.command()
def predict(
    model: str = typer.Option(
        ..., "--model", "-m", help="models:/NAME@ALIAS, models:/NAME/VERSION, or a checkpoint."
    ),
    input_path: Path = typer.Option(
        ...,
        "--input",
        "-i",
        help="Parquet, CSV, JSON or .xlsx (data.sheet) file/directory with the training's "
        "columns, or a folder of image files.",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Parquet file to write."),
    config_file: Path | None = ConfigOption,
    overrides: list[str] | None = SetOption,
    verbose: bool = VerboseOption,
) -> None:
    """Predict labels (or a regression's numbers) for new rows through the MLflow pyfunc model;
    writes the input columns plus prediction, and for a classifier one probability column per
    class and confidence."""
    from trainflow.env import prepare_environment

    config = _load(config_file, overrides)
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    from training.storage import trainflow_home

    # Ray Data's and MLflow's lines (importing the model module warns) go to the log file.
    with logged_to_file(trainflow_home(), "predict", verbose):
        from training.config import DataConfig
        from training.data.inputs import input_format, resolve_inputs
        from training.inference.predict import predict_files
        from training.platform import cluster

        try:
            files_of_model, _ = _model_files(config, model)
            source = DataConfig(source=str(input_path.resolve()), label_column="__none__")
            files = resolve_inputs(source, labelled=False)
            fmt = input_format(source, files)
            cluster.connect(config.ray)
            use_gpu, sheet = config.train.use_gpu, config.data.sheet
            rows = predict_files(files_of_model, files, str(output), fmt, use_gpu, sheet=sheet)
        finally:
            cluster.shutdown()
    console.print(f"wrote {rows} predictions to {output}")


@app.command("make-data")
def make_data(
    output: str = typer.Argument(..., help="Directory (or s3://bucket/prefix) to write into."),
    kind: str = typer.Option(
        "table",
        "--kind",
        "-k",
        help="table: 64 float32 features + label; images: 3x32x32 uint8; image-files: a folder "
        "of PNG digits in class sub-folders; mixed: numbers with gaps, text categories, dates "
        "and an id column; text: BBC News sentences resampled by topic.",
    ),
    rows: int = typer.Option(1_000_000, "--rows", "-n", min=1, help="Rows (images) to write."),
    files: int = typer.Option(16, "--files", "-f", min=1, help="Parquet files to write."),
    seed: int = typer.Option(0, "--seed", min=0, help="The same seed writes the same rows."),
    endpoint_url: str | None = typer.Option(
        None, "--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL)."
    ),
) -> None:
    """Write a seeded synthetic data set (parquet, streamed chunk by chunk) to train on."""
    import time

    from training.datasets import synthetic, synthetic_images, synthetic_mixed, synthetic_text

    writers = {
        "table": synthetic.write_table,
        "images": synthetic.write_color_images,
        "image-files": synthetic_images.write_image_files,
        "mixed": synthetic_mixed.write_mixed,
        "text": synthetic_text.write_text,
    }
    if kind not in writers:
        raise ConfigError(f"--kind {kind!r} is not one of {', '.join(writers)}")
    started = time.monotonic()
    written = writers[kind](output, rows, seed, num_files=files, endpoint_url=endpoint_url)
    hint = {
        "images": f"--set data.source={output} --set data.image_column=image "
        "--set data.image_shape=[3,32,32] --set model.kind=cnn",
        "image-files": f"--set data.source={output} --set data.image_shape=[1,16,16] "
        "--set model.kind=cnn",
        "text": f"--set data.source={output} --set data.label_column=category",
    }.get(kind, f"--set data.source={output}")
    console.print(
        f"wrote {rows:,} rows in {len(written)} files to {output} "
        f"({time.monotonic() - started:.1f} s); train on it with: trainflow run {hint}"
    )


app.command("compare")(compare_command)
app.command("inspect")(inspect_command.inspect)
app.command()(stack_commands.up)
app.command()(stack_commands.down)
app.command()(stack_commands.status)
app.command()(stack_commands.deploy)
app.command()(champion_commands.history)
app.command()(champion_commands.rollback)
app.command()(notify_commands.notify)
app.add_typer(schedule_app, name="schedule")


def main() -> None:  # pragma: no cover - the `trainflow` command and `python -m trainflow`
    """The app, then a prompt exit (trainflow/startup.py)."""
    try:
        app(prog_name="trainflow")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    startup.exit_promptly(code, last_word=interrupts.exit_code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
