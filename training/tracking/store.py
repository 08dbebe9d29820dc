"""The tracking store: where it is, whether it answers, and the experiment trainflow writes to."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from training.config import MlflowConfig, PipelineConfig
from training.errors import ConfigError, ServiceUnreachableError, TrainflowError
from training.platform import db_templates
from training.platform.probe import http_problem
from training.platform.secrets import redact
from training.storage import default_artifact_root, default_tracking_uri, trainflow_home
from training.tracking.runs import Tracker

log = logging.getLogger(__name__)

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
REGISTRY_URI_ENV = "MLFLOW_REGISTRY_URI"
# MLflow's default of 7 retries with backoff makes one call against a dead server take minutes;
# 2 bounds it unless the user set it (a dead server is caught sooner still: `check_reachable`).
# The request timeout stays MLflow's 120 s: a server slowed down by a busy machine answered
# after 10 s, our old timeout, and the retried POST runs/create made a second run of the same
# trial (6 trial runs for 4 trials in the MLflow UI, CI 2026-11-25).
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
HEALTH_TIMEOUT_S = 5.0


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store; None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///")
    return None if path in ("", ":memory:") else Path(path if path.startswith("/") else f"/{path}")


def resolve_tracking_uri(cfg: MlflowConfig) -> str:
    """``$MLFLOW_TRACKING_URI``, else ``mlflow.tracking_uri``, else sqlite in the trainflow home."""
    uri = os.environ.get(TRACKING_URI_ENV) or cfg.tracking_uri
    if uri:
        return uri.rstrip("/") if is_http(uri) else uri
    trainflow_home().mkdir(parents=True, exist_ok=True)
    return default_tracking_uri()


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
    """GET ``<uri>/health``; raise ServiceUnreachableError naming the fix if it does not answer.

    A 401/403 counts as up: the server runs, and MLflow's own calls carry the credentials.
    """
    problem = http_problem(uri.rstrip("/") + "/health", timeout, auth_counts_as_up=True)
    if problem is not None:
        raise ServiceUnreachableError(
            f"MLflow tracking server {redact(uri)} is not reachable ({redact(problem)}); start it "
            "(`trainflow up`) or set mlflow.tracking_uri / MLFLOW_TRACKING_URI"
        )


@contextlib.contextmanager
def global_uris(uri: str):
    """Point MLflow's process-wide tracking and registry URIs at ``uri`` for a block (for the
    fluent API, which reads only those).

    MLflow also exports them as MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI; left behind, every
    process started later (a server, a worker, another pipeline) would inherit our store.
    """
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_env = {k: os.environ.get(k) for k in (TRACKING_URI_ENV, REGISTRY_URI_ENV)}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield
    finally:
        tracking_utils._tracking_uri, registry_utils._registry_uri = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def artifact_location(uri: str, experiment: str, storage_root: str | None = None) -> str | None:
    """Where a new experiment keeps its artifacts: beside a local sqlite database (MLflow's
    default is ./mlruns of the current directory), or under an s3:// storage root; None lets a
    tracking server use its own default."""
    db = sqlite_path(uri)
    if db is not None and storage_root and storage_root.startswith("s3://"):
        return f"{storage_root.rstrip('/')}/mlartifacts/{experiment}"
    if uri == default_tracking_uri():
        return f"{default_artifact_root()}/{experiment}"
    if db is not None:
        return f"{(db.parent / 'mlartifacts').as_uri()}/{experiment}"
    return None


def apply_http_defaults() -> None:
    """MLflow's HTTP client settings of ours, where the user set none (read at each request)."""
    for key, value in HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def configure(config: PipelineConfig, create: bool = True) -> Tracker:
    """Connect to the tracking store and get or create the experiment.

    ``create=False`` only reads: a missing store or experiment raises TrainflowError (naming
    what is there) instead of being created.
    """
    client, uri = _connect(config, create)
    experiment_id = _experiment_id(client, uri, config, create)
    return Tracker(client, uri, experiment_id, config)


def registry_client(config: PipelineConfig):
    """A client of an existing store for the model registry only (history, rollback): the
    config's experiment need not exist there."""
    return _connect(config, create=False)[0]


def _connect(config: PipelineConfig, create: bool):
    """(MlflowClient, tracking URI) of the configured store; a local one is made or seeded."""
    from mlflow import MlflowClient

    apply_http_defaults()
    uri = resolve_tracking_uri(config.mlflow)
    if config.storage.endpoint_url:
        # MLflow's S3 artifact store (boto3) reads its endpoint from here; not a credential.
        os.environ.setdefault("MLFLOW_S3_ENDPOINT_URL", config.storage.endpoint_url)
    if is_http(uri):
        check_reachable(uri)
    db = sqlite_path(uri)
    if db is not None:
        if not create and not db.is_file():
            raise TrainflowError(
                f"no MLflow store at {db}: nothing was tracked there yet; run `trainflow run` "
                "first, or point mlflow.tracking_uri / MLFLOW_TRACKING_URI at your store"
            )
        db.parent.mkdir(parents=True, exist_ok=True)
    fresh = db is not None and not db.exists()
    seeded = fresh and db_templates.seed(
        db, "mlflow", _mlflow_version(), _default_experiment_in(db)
    )
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    if fresh and not seeded:
        client.search_experiments(max_results=1)  # MLflow creates its tables on first use
        db_templates.save(db, "mlflow", _mlflow_version())
    return client, uri


def _mlflow_version() -> str:
    import mlflow

    return mlflow.__version__


def _default_experiment_in(db: Path):
    """A template's "Default" experiment (id 0) keeps its artifacts where the first home's
    working directory was; this home's copy keeps them beside its own database."""

    def fix_up(conn) -> None:
        location = (db.parent / "mlartifacts" / "0").as_uri()
        conn.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (location,)
        )

    return fix_up


# MLflow's experiment kind (its UI reads this tag): model training, not GenAI development.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


def _experiment_id(client, uri: str, config: PipelineConfig, create: bool) -> str:
    """The id of the experiment named in the config, created first if missing (and allowed)."""
    from mlflow.exceptions import MlflowException

    name = config.mlflow.experiment
    experiment = client.get_experiment_by_name(name)
    if experiment is None and not create:
        names = sorted(e.name for e in client.search_experiments(max_results=50))
        raise TrainflowError(
            f"no MLflow experiment {name!r} in {redact(uri)}; experiments there: "
            f"{', '.join(names) or 'none'} (choose one with mlflow.experiment, e.g. "
            "`trainflow compare --experiment NAME`)"
        )
    if experiment is None:
        location = artifact_location(uri, name, config.storage.root)
        try:
            return client.create_experiment(
                name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND}
            )
        except MlflowException as exc:  # created meanwhile by another process
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
            log.debug("experiment %s created concurrently: %s", name, exc)
            return experiment.experiment_id
    if experiment.lifecycle_stage == "deleted":
        raise ConfigError(
            f"MLflow experiment {name!r} is deleted; restore it (`mlflow experiments restore "
            f"--experiment-id {experiment.experiment_id}`) or set mlflow.experiment to another name"
        )
    if create and EXPERIMENT_KIND_TAG not in experiment.tags:  # created before the tag
        client.set_experiment_tag(
            experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
        )
    return experiment.experiment_id
