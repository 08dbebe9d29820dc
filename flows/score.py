"""The scoring flow (deployment ``pipeline/score``): a table scored with the champion on a
schedule. Named ``pipeline`` like the training flow, so every trainflow deployment is
``pipeline/<name>`` and the failure notification (docs/notifications.md) covers it too."""

from __future__ import annotations

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import create_table_artifact

from flows import quiet_errors
from training.config import PipelineConfig
from training.platform import cluster
from training.stages import score as score_stage


@flow(name="pipeline", log_prints=True)
def score(config: PipelineConfig | None = None, source: str | None = None) -> dict:
    """Score ``source`` (default: the config's ``data.source``; a file or directory, local or
    s3://) with the registered model's champion; the predictions go beside it."""
    quiet_errors.install()
    config = config or PipelineConfig()
    run_id = str(runtime.flow_run.id or "local").replace("-", "")[:12]
    try:
        scored = score_stage.score(config, source or config.data.source, run_id)
    finally:
        cluster.shutdown()
    get_run_logger().info(
        "scored %d rows with %s version %s in %.1f s: %s",
        scored.rows,
        scored.model,
        scored.version,
        scored.seconds,
        scored.output,
    )
    create_table_artifact(
        [scored.to_dict()],
        key="score",
        description=f"{scored.rows} rows scored with {scored.model} version {scored.version}",
    )
    return scored.to_dict()
