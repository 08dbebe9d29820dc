"""The pipeline flow called from `trainflow run`: a stop by signal and a Prefect server gone
for good each reported in one line."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import typer

from trainflow.output import errors
from trainflow.prefect_outage import explained, stop_waiting
from training.errors import TrainflowError

if TYPE_CHECKING:
    from trainflow.prefect_server import EarlyTemporaryServer
    from training.summary import RunSummary


def run_flow(config, run_id: str | None, prefect_server: EarlyTemporaryServer | None) -> RunSummary:
    """The flow, with Ctrl-C and SIGTERM reported as such (exit 130 / 143)."""
    from prefect.exceptions import TerminationSignal

    from flows.pipeline import pipeline  # ~12 s of imports while Prefect's server starts
    from training.platform import signals

    again = f"; resume with `trainflow run --resume {run_id}`" if run_id else ""
    try:
        if prefect_server is not None:
            prefect_server.wait()
        return pipeline(config=config, run_id=run_id)
    except TrainflowError:
        raise  # reported by the app's error handler, even after a signal
    except BaseException as exc:
        # Ctrl-C / SIGTERM: KeyboardInterrupt, Prefect's TerminationSignal, or, inside Ray
        # calls, a SystemExit; the signal Ray's watcher recorded tells them apart.
        received = signals.received()
        if isinstance(exc, KeyboardInterrupt) or received == signal.SIGINT:
            errors.print(f"[bold red]interrupted[/]: MLflow runs were marked KILLED{again}")
            raise typer.Exit(130) from None
        if isinstance(exc, TerminationSignal) or received == signal.SIGTERM:
            errors.print(
                f"[bold red]terminated[/] (SIGTERM): MLflow runs were marked KILLED{again}"
            )
            raise typer.Exit(143) from None
        outage = explained(exc, run_id)
        if outage is None:
            raise
        stop_waiting()  # a Prefect server gone for good: the exit need not wait for it again
        raise outage from exc
