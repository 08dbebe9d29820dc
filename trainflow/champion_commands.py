"""``trainflow history MODEL`` and ``trainflow rollback MODEL [--to VERSION]``: the champion
alias's moves, listed and undone (training/tracking/champion_history.py does the work); a
rollback emits the champion's event (flows/champion_events.py) like a promotion."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer

from trainflow.output import console

ConfigOption = typer.Option(None, "--config", "-c", help="YAML file of overrides.")
SetOption = typer.Option(None, "--set", "-s", help="Override one key (mlflow.tracking_uri=...).")


def _client(config_file: Path | None, overrides: list[str] | None):
    from trainflow.env import prepare_environment
    from training.config.overrides import load_config

    config = load_config(config_file, list(overrides or []))
    prepare_environment(tracking_uri_configured=config.mlflow.tracking_uri is not None)
    from training.tracking.store import registry_client

    return registry_client(config)


def history(
    model: str = typer.Argument(..., help="Registered model name, e.g. digits."),
    config_file: Path | None = ConfigOption,
    overrides: list[str] | None = SetOption,
) -> None:
    """Every move of the champion alias: when, from which version to which, why, the metrics."""
    from training.tracking.champion_history import history as moves_of

    moves = moves_of(_client(config_file, overrides), model)
    if not moves:
        console.print(f"{model}: the champion alias has never moved")
    for move in moves:  # one line each: grep-able, and never cut to the terminal's width
        metrics = ", ".join(f"{k}={v}" for k, v in sorted(move.get("metrics", {}).items()))
        console.print(
            f"{move['when']}  {move['kind']:<8} version {move.get('from') or '-'} -> "
            f"{move['to']}  by {move.get('by', '?')}: {move.get('why', '')}"
            + (f"  [{metrics}]" if metrics else ""),
            soft_wrap=True,
            markup=False,
            highlight=False,
        )


def rollback(
    model: str = typer.Argument(..., help="Registered model name, e.g. digits."),
    to: str | None = typer.Option(
        None, "--to", help="Version to make champion (default: the previous champion)."
    ),
    why: str = typer.Option("", "--why", help="Reason, recorded on the version and history."),
    config_file: Path | None = ConfigOption,
    overrides: list[str] | None = SetOption,
) -> None:
    """Move the champion alias back to the previous champion (or --to VERSION), under the
    promotion lock; records who, when and why."""
    from training.tracking.champion_history import rollback as roll_back

    client = _client(config_file, overrides)
    move = roll_back(client, model, to, why)
    console.print(
        f"{model}: champion moved from version {move['from']} to version {move['to']} "
        f"({json.dumps(move['why'])}, by {move['by']} at {move['when']})"
    )
    _announce(client, model, move)


def _announce(client, model: str, move: dict) -> None:
    """The same event a promoting run emits, for `trainflow notify`'s automation: with the gate's
    metric and value stored on the version that is champion again."""
    from flows.champion_events import champion_rolled_back
    from training.gate.policy import METRIC_TAG, VALUE_TAG

    tags = client.get_model_version(model, move["to"]).tags
    value = tags.get(VALUE_TAG)
    with contextlib.suppress(TypeError, ValueError):  # else kept as the tag says
        value = float(value)
    champion_rolled_back(model, move, tags.get(METRIC_TAG), value)
