"""The typed summary of one pipeline run: built once by the flow, taken by every renderer (the
console tables, the Prefect markdown artifact, the HTML report) and written as JSON by
:meth:`RunSummary.to_dict` (``trainflow run --summary-json``, summary.json on the parent run;
the benchmarks and tests read its keys, so its shape is a contract)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from training.tune.outcome import SweepOutcome, TrialSummary


@dataclass
class DataSummary:
    """The preprocessed data the run trained on."""

    source: str
    fingerprint: str
    rows: dict[str, int]  # split -> rows
    preprocess_cached: bool  # the preprocessing of an earlier run was reused


@dataclass
class MlflowSummary:
    """Where the run is in MLflow (the tracking URI without credentials)."""

    tracking_uri: str
    experiment: str
    experiment_id: str
    parent_run_id: str
    train_run_id: str
    ui_command: str  # the shell command that opens the MLflow UI on this store
    # The parent run's page in the MLflow UI's training view (a local store: once ui_command runs)
    run_url: str = ""


@dataclass
class ModelSummary:
    """The registered model version and the promotion gate's decision about it."""

    name: str
    version: str
    model_uri: str
    logged_model_uri: str
    source_run_id: str
    state_file: str
    decision: str  # first-model | promoted | kept-champion
    champion_version: str | None
    challenger_version: str
    challenger_value: float
    champion_value: float | None  # the champion's value before the gate; None: none to compare
    aliases: list[str] = field(default_factory=list)
    #: The gate's record (training.gate.policy.GateRecord as a dict: metric, champion,
    #: challenger, difference, interval, slices, verdict, reason); the flow publishes it as a
    #: table artifact. None: an older summary.
    gate_record: dict[str, Any] | None = None


@dataclass
class RunSummary:
    """One pipeline run: data, sweep, test metrics, MLflow, model, locations, timings."""

    run_id: str
    data: DataSummary
    sweep: SweepOutcome | None  # None: sweep.enabled false
    test_metrics: dict[str, float]
    mlflow: MlflowSummary
    model: ModelSummary
    checkpoint: str
    storage: str  # the run's directory (Tune state, checkpoints)
    stage_seconds: dict[str, float]  # stage -> wall seconds, in stage order
    report: str | None = None  # where to open the HTML report; None: it was not built
    #: The Ray Dashboard of the cluster that trained, while it can still be opened: an existing
    #: cluster's. None where the run's own local instance served it (it stops with the run;
    #: the train line showed it while training ran).
    ray_dashboard: str | None = None
    #: The final training's last epoch as the train run logged it (epoch, workers, losses,
    #: ``train_rows_per_s`` or ``train_tokens_per_s``, ``data_wait_share`` where the loop
    #: measured them). None: no epoch was recorded.
    last_epoch: dict[str, float] | None = None
    #: The tracking outages the run met (a resume: its stopped run's too), each as the parent
    #: run's ``outages.json`` has it (training.tracking.outage_record). Empty: none.
    outages: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: keys and nesting as the field order above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> RunSummary:
        """The inverse of :meth:`to_dict` (a summary.json read back)."""
        sweep = summary.get("sweep")
        return cls(
            run_id=summary["run_id"],
            data=DataSummary(**summary["data"]),
            sweep=_sweep_from_dict(sweep) if sweep is not None else None,
            test_metrics=dict(summary["test_metrics"]),
            mlflow=MlflowSummary(**summary["mlflow"]),
            model=ModelSummary(**summary["model"]),
            checkpoint=summary["checkpoint"],
            storage=summary["storage"],
            stage_seconds=dict(summary["stage_seconds"]),
            report=summary.get("report"),
            ray_dashboard=summary.get("ray_dashboard"),
            last_epoch=summary.get("last_epoch"),
            outages=list(summary.get("outages") or []),
        )


def _sweep_from_dict(sweep: Mapping[str, Any]) -> SweepOutcome:
    trials = [TrialSummary(**trial) for trial in sweep.get("trials") or []]
    return SweepOutcome(**{**sweep, "trials": trials})
