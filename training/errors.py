"""Errors that reach the user: each message says what was wrong and how to fix it."""

from __future__ import annotations


class TrainflowError(Exception):
    """Base of every error trainflow raises on purpose."""

    #: A retry can never fix this error (bad input, bad config): Prefect must not retry it.
    retriable: bool = False
    #: The user can fix it (their config, data, model, server address): exit code 2, not 1.
    user_error: bool = False


class ConfigError(TrainflowError):
    """An invalid configuration value; raised before anything starts."""

    user_error = True


class DataValidationError(TrainflowError):
    """The input data cannot be used as given (missing column, NaN label, empty, corrupt...)."""

    user_error = True


class StorageError(TrainflowError):
    """A storage location cannot be read or written."""


class ServiceUnreachableError(TrainflowError):
    """A server (MLflow, Prefect, S3, Ray) did not answer. Transient: retrying may help."""

    user_error = True
    retriable = True


class TrackingUnavailableError(TrainflowError):
    """The MLflow server stopped answering during a stage and did not come back within the
    grace: the run stops (exit 1) and can be resumed. The stage that raises it does not know
    the run's id: its message says :data:`RESUME_ANY`, which the flow fills in (:meth:`naming`)."""

    RESUME_ANY = "trainflow run --resume <run id>"

    def naming(self, run_id: str) -> TrackingUnavailableError:
        """The same error, its resume command naming ``run_id``."""
        named = TrackingUnavailableError(
            str(self).replace(self.RESUME_ANY, f"trainflow run --resume {run_id}")
        )
        named.__cause__ = self.__cause__
        return named


class TrackingBlipError(TrainflowError):
    """The MLflow server stopped answering during a stage and came back: the stage runs again
    (Prefect's task retry)."""

    retriable = True


class TrainingDivergedError(TrainflowError):
    """The loss became NaN/inf: the hyperparameters, not the machine, are at fault."""

    user_error = True


class WorkerFailedError(TrainflowError):
    """Ray Train gave up after ``train.max_failures`` worker-group restarts (crash, hang, kill).

    Retriable: a re-run with the same run id resumes from the last complete checkpoint.
    """

    retriable = True


class FunctionContractError(TrainflowError):
    """``train.engine: function``: the user's function broke what trainflow needs of it (a report
    per epoch carrying the ranked metric, a checkpoint holding a loadable ``model.pt``)."""

    user_error = True


class UnsafeCheckpointError(TrainflowError):
    """A checkpoint file holds more than tensors and plain data: loading it could run code."""

    user_error = True


class ModelNotFoundError(TrainflowError):
    """A model URI or checkpoint does not exist or is not a trainflow model."""

    user_error = True


def is_retriable(exc: BaseException) -> bool:
    """True unless the exception is one of ours that a retry cannot fix."""
    if isinstance(exc, TrainflowError):
        return exc.retriable
    return True


def one_line(error: BaseException | str, limit: int = 300, last: bool = False) -> str:
    """The error's message as one line for a user: its first non-empty line, or its last one
    with ``last`` (Ray wraps a worker's error in lines of its own and puts the original last).
    Cut to ``limit`` characters; the exception's type when the message is empty."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    line = lines[-1] if last else lines[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"
