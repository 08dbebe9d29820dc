"""``trainflow schedule pause|resume NAME``: a deployment's schedule switched off and on, with
Prefect's own deployment pause (deployments/deploy.py: set_paused)."""

from __future__ import annotations

import typer

from trainflow.output import console

app = typer.Typer(
    help="Pause or resume a deployment's schedule (nightly, smoke, score).", no_args_is_help=True
)
NameArgument = typer.Argument(..., help="The deployment: nightly, smoke or score.")


def _set_paused(name: str, paused: bool) -> None:
    from deployments.deploy import FLOW_NAME, set_paused
    from trainflow.env import check_prefect_api, prepare_environment

    prepare_environment()
    check_prefect_api()
    deployment_id = set_paused(name, paused)
    what = "paused: no more scheduled runs" if paused else "resumed: its next runs are scheduled"
    console.print(f"{FLOW_NAME}/{name} ({deployment_id}) {what}", highlight=False)


@app.command()
def pause(name: str = NameArgument) -> None:
    """Stop the deployment's schedule; scheduled runs not yet started are dropped."""
    _set_paused(name, paused=True)


@app.command()
def resume(name: str = NameArgument) -> None:
    """Start the deployment's schedule; the Prefect worker runs each run when it is due."""
    _set_paused(name, paused=False)
