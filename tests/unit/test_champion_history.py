"""The champion alias's history and rollback on a sqlite MLflow store, and the two commands."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from training.config import MlflowConfig, PipelineConfig

NAME = "hist-model"


@pytest.fixture
def uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def tracker(uri):
    from training.tracking.store import configure

    config = PipelineConfig(mlflow=MlflowConfig(tracking_uri=uri, registered_model=NAME))
    tracker = configure(config)
    tracker.client.create_registered_model(NAME)
    return tracker


def _version(tracker) -> str:
    return str(tracker.client.create_model_version(NAME, "file:///nowhere/model").version)


def _two_champions(tracker) -> tuple[str, str]:
    """Version 1 (first model, 0.8), then version 2 promoted over it (0.9)."""
    from training.tracking import registry

    first, second = _version(tracker), _version(tracker)
    assert registry.promote(tracker, first, 0.8)["decision"] == "first-model"
    assert registry.promote(tracker, second, 0.9)["decision"] == "promoted"
    return first, second


def test_every_move_of_the_champion_is_in_the_history(tracker):
    from training.tracking import registry
    from training.tracking.champion_history import history

    first, second = _two_champions(tracker)
    third = _version(tracker)
    assert registry.promote(tracker, third, 0.85)["decision"] == "kept-champion"
    moves = history(tracker.client, NAME)
    assert [(m["from"], m["to"], m["kind"]) for m in moves] == [
        (None, first, "promote"),
        (first, second, "promote"),
    ]
    assert moves[1]["metrics"] == {"test_accuracy": 0.9}
    assert moves[1]["why"].startswith("promoted on test_accuracy") and moves[1]["when"]


def test_rollback_moves_back_to_the_previous_champion_and_records_it(tracker):
    from training.tracking.champion_history import history, rollback

    first, second = _two_champions(tracker)
    move = rollback(tracker.client, NAME, why="bad answers in production")
    assert (move["from"], move["to"], move["kind"]) == (second, first, "rollback")
    champion = tracker.client.get_model_version_by_alias(NAME, "champion")
    assert str(champion.version) == first
    assert champion.tags["trainflow.rollback.why"] == "bad answers in production"
    assert champion.tags["trainflow.rollback.by"]
    assert history(tracker.client, NAME)[-1] == move
    again = rollback(tracker.client, NAME, to=second)  # and forward again, by name
    assert (again["from"], again["to"]) == (first, second)


def test_rollback_refuses_unknown_and_unevaluated_versions(tracker):
    from training.tracking.champion_history import RollbackRefused, rollback

    _, second = _two_champions(tracker)
    never = _version(tracker)
    with pytest.raises(RollbackRefused, match="no version '99'"):
        rollback(tracker.client, NAME, to="99")
    with pytest.raises(RollbackRefused, match="never evaluated"):
        rollback(tracker.client, NAME, to=never)
    with pytest.raises(RollbackRefused, match="already is the champion"):
        rollback(tracker.client, NAME, to=second)
    champion = tracker.client.get_model_version_by_alias(NAME, "champion")
    assert str(champion.version) == second  # nothing moved


def test_the_commands_print_the_history_and_exit_2_on_a_refusal(tracker, uri):
    from trainflow.cli import app

    first, second = _two_champions(tracker)
    runner = CliRunner()
    shown = runner.invoke(app, ["history", NAME, "--set", f"mlflow.tracking_uri={uri}"])
    assert shown.exit_code == 0, shown.output
    assert "promote" in shown.output and "test_accuracy=0.9" in shown.output
    refused = runner.invoke(
        app, ["rollback", NAME, "--to", "42", "--set", f"mlflow.tracking_uri={uri}"]
    )
    assert refused.exit_code == 2, refused.output
    rolled = runner.invoke(app, ["rollback", NAME, "--set", f"mlflow.tracking_uri={uri}"])
    assert rolled.exit_code == 0, rolled.output
    assert f"from version {second} to version {first}" in rolled.output


def test_the_commands_need_the_registry_only_not_the_configs_experiment(tracker, uri):
    """A registry-only command works on a store that lacks the config's experiment (a model
    trained under another experiment name)."""
    from trainflow.cli import app

    first, second = _two_champions(tracker)
    elsewhere = ["--set", f"mlflow.tracking_uri={uri}", "--set", "mlflow.experiment=not-here"]
    runner = CliRunner()
    shown = runner.invoke(app, ["history", NAME, *elsewhere])
    assert shown.exit_code == 0, shown.output
    assert f"version {first} -> {second}" in shown.output
    rolled = runner.invoke(app, ["rollback", NAME, *elsewhere])
    assert rolled.exit_code == 0, rolled.output
    assert str(tracker.client.get_model_version_by_alias(NAME, "champion").version) == first
