"""The CLI's one error handler: exit 2 for the user's input, 1 for other failures of ours, and
a traceback for anything unexpected."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from trainflow.output import ReportingGroup
from training.errors import (
    ConfigError,
    DataValidationError,
    ServiceUnreachableError,
    TrainflowError,
)


def app_raising(exc: BaseException) -> typer.Typer:
    app = typer.Typer(cls=ReportingGroup, pretty_exceptions_enable=False)
    sub = typer.Typer()
    app.add_typer(sub, name="sub")

    @app.command()
    def boom() -> None:
        raise exc

    @sub.command("nested")
    def nested() -> None:  # a command of a sub-group is covered too
        raise exc

    return app


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("train.lr: must be > 0 [got -1]"), 2),
        (DataValidationError("label column 'species' is missing"), 2),
        (ServiceUnreachableError("Prefect API down"), 2),
        (TrainflowError("no MLflow store"), 1),
    ],
)
@pytest.mark.parametrize("command", [["boom"], ["sub", "nested"]])
def test_our_errors_exit_with_their_code_and_message(exc, code, command):
    result = CliRunner().invoke(app_raising(exc), command)
    assert result.exit_code == code
    assert f"error: {exc}" in result.output  # printed as written, markup-like text included
    assert "Traceback" not in result.output


def test_an_unexpected_error_keeps_its_traceback():
    result = CliRunner().invoke(app_raising(KeyError("bug")), ["boom"])
    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)
