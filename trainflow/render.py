"""Rich tables of a run summary, printed at the end of ``trainflow run``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from training.report.trials import count_fates, fmt

if TYPE_CHECKING:
    from training.summary import RunSummary


def _pairs(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, fmt(value))
    return table


def summary_tables(summary: RunSummary) -> list[Table]:
    data, mlflow, model, sweep = summary.data, summary.mlflow, summary.model, summary.sweep
    tables = [
        _pairs(
            f"trainflow run {summary.run_id}",
            [
                ("data", data.source),
                ("fingerprint", data.fingerprint),
                ("preprocessing", "reused (cached)" if data.preprocess_cached else "computed"),
                *((f"rows {split}", rows) for split, rows in data.rows.items()),
            ],
        )
    ]
    if sweep:
        fates = count_fates(sweep.trials)
        tables.append(
            _pairs(
                "sweep (Ray Tune + ASHA)",
                [
                    ("best trial", sweep.best_trial_id),
                    (f"best {sweep.metric}", sweep.best_metric),
                    *((f"param {k}", v) for k, v in sweep.best_params.items()),
                    ("trials", ", ".join(f"{n} {fate}" for fate, n in fates.items())),
                    ("epochs spent / budget", f"{sweep.epochs_spent} / {sweep.epochs_budget}"),
                ],
            )
        )
    tables.append(_pairs("test metrics", list(summary.test_metrics.items())))
    tables.append(
        _pairs(
            "model registry",
            [
                ("model", f"{model.name} version {model.version}"),
                ("gate", model.decision),
                ("aliases of this version", ", ".join(model.aliases) or "none"),
                ("champion", f"version {model.champion_version}"),
            ],
        )
    )
    tables.append(
        _pairs(
            "where things are",
            [
                ("MLflow experiment", f"{mlflow.experiment} (id {mlflow.experiment_id})"),
                ("MLflow parent run", mlflow.parent_run_id),
                ("tracking URI", mlflow.tracking_uri),
                ("checkpoint", summary.checkpoint),
                ("run storage", summary.storage),
                ("open the MLflow UI", mlflow.ui_command),
            ],
        )
    )
    tables.append(_pairs("wall seconds per stage", list(summary.stage_seconds.items())))
    return tables
