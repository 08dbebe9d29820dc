"""Each stage task runs inside :func:`tracking_blips`: a stage that failed because the MLflow
server stopped answering waits for it (``training.tracking.outage``), then asks Prefect's task
retry to run it again. The wait goes into the run's record of outages
(``training.tracking.outage_record``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from training.config import PipelineConfig
from training.errors import TrackingBlipError
from training.platform.secrets import redact
from training.tracking import outage_record
from training.tracking.outage import is_server_gone, wait_until_answering


@contextlib.contextmanager
def tracking_blips(config: PipelineConfig, stage: str) -> Iterator[None]:
    """Run a stage; if it failed because the MLflow server stopped answering, wait for the
    server within the grace and raise a retriable error so the stage runs again."""
    try:
        yield
    except Exception as exc:
        from training.tracking.store import is_http, resolve_tracking_uri

        uri = resolve_tracking_uri(config.mlflow)
        # A connection error from another service (S3) while MLflow answers is not ours to
        # wait out: it goes on as any failure (Prefect's retry rule decides).
        if not is_http(uri) or not is_server_gone(exc) or _answers(uri):
            raise
        with outage_record.watch(uri, f"the {stage} stage"):
            waited = wait_until_answering(uri, config.mlflow.outage_grace_s, stage)
        raise TrackingBlipError(
            f"MLflow at {redact(uri)} stopped answering during {stage} and answers again "
            f"after {waited:.0f} s; {stage} runs again"
        ) from exc


def _answers(uri: str) -> bool:
    from training.errors import ServiceUnreachableError
    from training.tracking.store import check_reachable

    try:
        check_reachable(uri)
    except ServiceUnreachableError:
        return False
    return True
