"""Progress reporting: rich bars (rate, ETA) for people, silence for --json and tests."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Items per second in the phase's own unit (rows/s, pairs/s)."""

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "it")
        return Text(f"{speed:,.0f} {unit}/s" if speed else f"-- {unit}/s", style="cyan")


class Reporter:
    """No progress bars (scripts, logs, tests); notes still go to stderr. The interface the pipeline calls."""

    @contextmanager
    def phase(self, name: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
        yield lambda n: None

    def note(self, text: str) -> None:
        print(text, file=sys.stderr)


class RichReporter(Reporter):
    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)

    @contextmanager
    def phase(self, name: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
        columns = (TextColumn("[bold]{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
                   RateColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=False) as bar:
            task = bar.add_task(name, total=total, unit=unit)
            yield lambda n: bar.advance(task, n)

    def note(self, text: str) -> None:
        self.console.print(text)
