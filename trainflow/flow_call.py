"""The pipeline flow called from `trainflow run`, a Prefect server gone for good reported in
one line (a stop by signal: trainflow/interrupts.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainflow.prefect_outage import explained, stop_waiting
from training.errors import TrainflowError

if TYPE_CHECKING:
    from trainflow.prefect_server import EarlyTemporaryServer
    from training.summary import RunSummary


def run_flow(config, run_id: str | None, prefect_server: EarlyTemporaryServer | None) -> RunSummary:
    """The flow, once Prefect's server is up."""
    from flows.pipeline import pipeline  # ~12 s of imports while Prefect's server starts

    try:
        if prefect_server is not None:
            prefect_server.wait()
        return pipeline(config=config, run_id=run_id)
    except TrainflowError:
        raise  # reported by the app's error handler
    except Exception as exc:  # a signal's exception goes on to trainflow/interrupts.py
        outage = explained(exc, run_id)
        if outage is None:
            raise
        stop_waiting()  # a Prefect server gone for good: the exit need not wait for it again
        raise outage from exc
