"""Registered versions: found by their source run, described, and promoted (the champion
alias moved as the gate decides). Logging and registering a model is the flavour's
(:mod:`training.tracking.flavour`).

Registered versions carry the gate's decision as ``gate.*`` tags and two aliases:
``challenger`` (the latest candidate) and ``champion`` (the model in use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from training.config import registered_model_name
from training.gate import policy as gate
from training.tracking.champion_history import record_move
from training.tracking.lock import registry_lock
from training.tracking.runs import Tracker, filter_literal

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"


def version_of_run(tracker: Tracker, name: str, run_id: str):
    """The oldest version of registered model ``name`` registered from ``run_id``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        versions = tracker.client.search_model_versions(
            f"name = {filter_literal(name)} and run_id = {filter_literal(run_id)}"
        )
    except MlflowException as exc:
        log.debug("no versions of %s from run %s: %s", name, run_id, exc)
        return None
    return min(versions, key=lambda v: int(v.version)) if versions else None


def describe_model(tracker: Tracker, description: str, version: str | None = None) -> None:
    """Set the description of the registered model, or of one of its versions."""
    name = registered_model_name(tracker.config)
    if version is None:
        tracker.client.update_registered_model(name, description=description)
    else:
        tracker.client.update_model_version(name, str(version), description=description)


def promote(
    tracker: Tracker,
    version: str,
    challenger_value: float,
    judge: Callable[[gate.Champion, str], gate.Decision] | None = None,
) -> dict[str, Any]:
    """Alias ``challenger`` to ``version``; move ``champion`` to it only if it wins the gate.

    ``judge`` decides against a champion (the promote stage scores both on the same rows);
    without it the challenger's value is compared with the value stored on the champion
    (:func:`training.gate.policy.decide`). Either way it runs under the promotion lock."""
    client = tracker.client
    name = registered_model_name(tracker.config)
    metric, min_delta = tracker.config.mlflow.gate.metric, tracker.config.mlflow.gate.min_delta
    version, challenger_value = str(version), float(challenger_value)
    # Read the champion, compare and move the aliases as one step: two runs promoting at
    # once must not both read the old champion and the worse one write last.
    with registry_lock(client, name):
        client.set_registered_model_alias(name, CHALLENGER, version)
        champion = current_champion(tracker, name)
        decision = gate.decide(metric, min_delta, version, challenger_value, champion)
        if judge is not None and champion is not None and not decision.repeated:
            decision = judge(champion, version)
        if decision.takes_champion and not decision.repeated:
            client.set_registered_model_alias(name, CHAMPION, version)
            why = decision.record.reason if decision.record else _why(decision, metric)
            record_move(
                client, name, decision.previous, version, why, "promote", {metric: challenger_value}
            )
        if not decision.repeated:
            for key, value in gate.version_tags(metric, challenger_value, decision).items():
                client.set_model_version_tag(name, version, key, value)
        aliases = list(client.get_model_version(name, version).aliases)
    return {
        "decision": decision.decision,
        "champion_version": version if decision.takes_champion else decision.previous,
        "challenger_version": version,
        "challenger_value": challenger_value,
        "champion_value": decision.champion_value,
        "aliases": sorted(aliases),
        "record": decision.record,
    }


def _why(decision: gate.Decision, metric: str) -> str:
    """A decision without a record (on the stored values), in words."""
    if decision.champion_value is None:
        return decision.decision
    return (
        f"{decision.decision} on {metric} (champion's stored value {decision.champion_value:.4g})"
    )


def current_champion(tracker: Tracker, name: str) -> gate.Champion | None:
    """The version aliased champion, as the gate reads it; None when there is none yet."""
    from mlflow.exceptions import MlflowException

    try:
        found = tracker.client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST" and "not found" not in str(exc).lower():
            raise
        return None
    return gate.Champion(str(found.version), dict(found.tags))
