"""The run's progress on the console: a live line per stage on a terminal, plain lines elsewhere.

It listens to trainflow's progress events (``training.progress``). On a terminal each stage has
one line that updates in place (rich ``Live``). When stdout is not a terminal (CI, a Prefect
worker's log, a pipe) each stage prints when it ends, and a stage that runs long prints its
latest progress at most once per ``plain_every_s``: a whole run stays a few dozen lines.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from training import progress

STAGES = ("preprocess", "sweep", "train", "evaluate", "promote")


@dataclass
class _Stage:
    name: str
    state: str = "waiting"  # waiting | running | done
    detail: str = ""
    seconds: float | None = None
    last_printed: float = field(default=0.0)


class ProgressView(logging.Handler):
    """A logging handler on :data:`training.progress.LOGGER` that draws the stages."""

    def __init__(self, console: Console, live: bool, plain_every_s: float = 30.0) -> None:
        super().__init__(level=logging.INFO)
        self.console = console
        self.plain_every_s = plain_every_s
        self.stages = {name: _Stage(name) for name in STAGES}
        self._live = Live(console=console, refresh_per_second=4, transient=False) if live else None
        self._lock = threading.Lock()

    # -- attach / detach ------------------------------------------------------------------------

    def __enter__(self) -> ProgressView:
        logger = logging.getLogger(progress.LOGGER)
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        if self._live is not None:
            self._live.update(self._render())
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(progress.LOGGER).removeHandler(self)
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()

    # -- events ---------------------------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        fields = progress.fields_of(record)
        if fields is None or fields.get("stage") not in self.stages:
            return
        with self._lock:
            stage = self.stages[fields["stage"]]
            event = fields.get("event")
            if event == "start":
                stage.state = "running"
                stage.last_printed = time.monotonic()  # the first line comes after a while
            elif event == "done":
                stage.state, stage.seconds = "done", fields.get("seconds")
            else:
                stage.detail = record.getMessage().split(": ", 1)[-1]
            if self._live is not None:
                self._live.update(self._render())
            else:
                self._print_plain(stage, event)

    def _print_plain(self, stage: _Stage, event: str | None) -> None:
        number = STAGES.index(stage.name) + 1
        head = f"[{number}/{len(STAGES)}] {stage.name}"
        if event == "done":
            detail = f" {stage.detail} ·" if stage.detail else ""
            self.console.print(
                f"{head}:{detail} done in {stage.seconds:.1f} s", highlight=False, soft_wrap=True
            )
        elif event is None and stage.state == "running":
            now = time.monotonic()
            if now - stage.last_printed >= self.plain_every_s:
                stage.last_printed = now
                self.console.print(f"{head}: {stage.detail}", highlight=False, soft_wrap=True)

    # -- the live view ----------------------------------------------------------------------------

    def _render(self) -> Group:
        table = Table.grid(padding=(0, 1))
        table.add_column(width=2)
        table.add_column(style="bold", min_width=10)
        table.add_column()
        for number, stage in enumerate(self.stages.values(), start=1):
            if stage.state == "done":
                mark: Text | Spinner = Text("✓", style="green")
                detail = (
                    f"{stage.detail} · {stage.seconds:.1f} s"
                    if stage.detail
                    else (f"{stage.seconds:.1f} s")
                )
            elif stage.state == "running":
                mark, detail = Spinner("dots"), stage.detail or "starting"
            else:
                mark, detail = Text("·", style="dim"), ""
            table.add_row(mark, f"{number}/{len(STAGES)} {stage.name}", Text(detail))
        return Group(table)
