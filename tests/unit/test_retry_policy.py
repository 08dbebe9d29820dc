"""The stage tasks' retry condition: transient failures retry, bad input never does."""

from __future__ import annotations

import pytest
from prefect.states import Failed

from tasks.policy import retry_unless_bad_input
from training.errors import (
    ConfigError,
    DataValidationError,
    ServiceUnreachableError,
    TrainingDivergedError,
)


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (ConfigError("bad key"), False),
        (DataValidationError("missing column"), False),
        (TrainingDivergedError("nan"), False),
        (ServiceUnreachableError("server down"), True),
        (RuntimeError("worker lost"), True),
        (OSError("disk hiccup"), True),
    ],
)
def test_retry_condition(exc, retried):
    assert retry_unless_bad_input(None, None, Failed(data=exc)) is retried
