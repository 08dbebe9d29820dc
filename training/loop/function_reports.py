"""What the user's function reports (``train.engine: function``; the Lightning engine's module,
through Ray's report callback, likewise): the contract checked on Ray Train's controller at
every report, and the per-epoch history the driver keeps of it.

The loop's history travels in its own checkpoints; a user's checkpoint is theirs, so the
history is built in the driver from the reports the controller forwards
(``training.loop.progress``): one report is one epoch, as ASHA counts them.
"""

from __future__ import annotations

import posixpath
from typing import Any

from ray.train.v2.api.callback import UserCallback

from training.errors import FunctionContractError

#: The file a function's checkpoint directory holds: the factory module's ``state_dict``.
MODEL_FILE = "model.pt"
CONTRACT = "docs/your-training-code.md"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class ReportContract(UserCallback):
    """On the controller: every report carries the metrics trainflow ranks by (numbers), and
    every checkpoint holds ``model.pt``. A broken report ends the fit with a
    FunctionContractError, which is never retried (a controller error).

    ``function``: the user's code as the messages name it (``train.function``, or for the
    Lightning engine ``model.factory``)."""

    #: What every reported checkpoint must hold; None where trainflow's callback writes it.
    model_file: str | None = MODEL_FILE

    def __init__(self, function: str, required: list[str]) -> None:
        self.function = function
        self.required = list(dict.fromkeys(required))

    def missing_metrics(self, reported: list[str], missing: list[str]) -> str:
        """The one-line error of a report without ``missing``."""
        return (
            f"train.function {self.function!r} reported {reported} without "
            f"{', '.join(missing)}: every ray.train.report must carry "
            f"{' and '.join(self.required)} (sweep.metric and "
            f"train.checkpoint.score_attribute) as a number, once per epoch; see {CONTRACT}"
        )

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        reported = metrics[0] if metrics else {}
        missing = [key for key in self.required if not _is_number(reported.get(key))]
        if missing:
            raise FunctionContractError(self.missing_metrics(sorted(reported), missing))
        if self.model_file and checkpoint is not None and not _holds_model_file(checkpoint):
            raise FunctionContractError(
                f"train.function {self.function!r} reported a checkpoint without {MODEL_FILE}: "
                f"save the state_dict of the module model.factory builds as {MODEL_FILE} in the "
                f"checkpoint directory; see {CONTRACT}"
            )


def _holds_model_file(checkpoint) -> bool:
    from pyarrow.fs import FileType

    path = posixpath.join(checkpoint.path, MODEL_FILE)
    return checkpoint.filesystem.get_file_info(path).type == FileType.File


class ReportHistory:
    """In the driver: one row per epoch from the function's reports, each epoch once.

    After a worker-group restart the function resumes from its latest checkpoint, so the
    reports made since that checkpoint are dropped: they are trained, and reported, again."""

    def __init__(self, epochs_done: int = 0) -> None:
        # A run resumed with --resume: the function continues from its checkpoint after the
        # epochs the train run already holds, and its reports are numbered after them.
        self._done = epochs_done
        self.epochs: list[dict[str, float]] = []
        self._checkpointed = 0  # epochs covered by the latest checkpoint

    def add(self, metrics: dict[str, Any], checkpointed: bool) -> dict[str, float]:
        """The report's numbers as the next epoch's row (``epoch`` counts from 1)."""
        row = {key: float(value) for key, value in metrics.items() if _is_number(value)}
        row["epoch"] = self._done + len(self.epochs) + 1
        self.epochs.append(row)
        if checkpointed:
            self._checkpointed = len(self.epochs)
        return row

    def restarted(self) -> None:
        del self.epochs[self._checkpointed :]

    def epoch_of(self, metrics: dict[str, Any]) -> int | None:
        """trainflow's number of the epoch that reported ``metrics`` (a checkpoint's, as Ray
        ranked it), or None: the user's own ``epoch`` key (Lightning's counts from 0) is not
        the one the train run's steps use."""
        wanted = {k: float(v) for k, v in metrics.items() if _is_number(v) and k != "epoch"}
        for row in reversed(self.epochs):
            if wanted and all(row.get(key) == value for key, value in wanted.items()):
                return int(row["epoch"])
        return None
