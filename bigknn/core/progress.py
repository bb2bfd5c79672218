"""Progress reporting: rich bars (rate, ETA) for people on a terminal, a log line every ``log_every_s()``
seconds otherwise (cron, ``--json``, the Python API), both through the ``bigknn`` logger.

The CLI points that logger at stderr (``configure_logging``: INFO by default, WARNING with ``--quiet``,
DEBUG with ``--verbose``); a library user's logging configuration decides what the API shows (Python's
default shows warnings only: the notes, never the progress lines).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text

from bigknn.core import envvars
from bigknn.core.human import human_duration

log = logging.getLogger("bigknn")

LOG_EVERY_S = 30.0  # seconds between progress lines where no bar is shown


def log_every_s() -> float:
    """Seconds between progress log lines (env BIGKNN_LOG_EVERY_S overrides; 0 turns them off)."""
    return envvars.seconds("BIGKNN_LOG_EVERY_S", LOG_EVERY_S)


_console: Console | None = None


def stderr_console() -> Console:
    """The one console of bars and log lines on stderr, shared so that lines print above a live bar (rich
    honours NO_COLOR, and writes plain text off a terminal)."""
    global _console
    if _console is None:
        _console = Console(stderr=True)
    return _console


def configure_logging(level: int) -> None:
    """Send the ``bigknn`` logger's records at ``level`` and above to stderr, one line each: through rich
    on a terminal (so lines and bars do not tear each other), ``bigknn: <message>`` otherwise."""
    if sys.stderr.isatty():
        handler: logging.Handler = RichHandler(console=stderr_console(), show_time=False, show_level=False,
                                               show_path=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("bigknn: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


class _Count:
    """Items done in a phase, advanced from any worker thread, and the line that reports them. ``parts``: the
    kinds of item a phase mixes and how many of each (a build's shards' GNND and pair merges), counted and
    reported apart: a rate over both would say nothing."""

    def __init__(self, name: str, total: int, unit: str, parts: dict[str, int] | None = None):
        self.name, self.total, self.unit = name, total, unit
        self.parts = dict(parts or {})
        self.done = 0
        self.part_done = dict.fromkeys(self.parts, 0)
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def advance(self, n: int, part: str | None = None) -> None:
        with self._lock:
            self.done += n
            if part is not None:
                self.part_done[part] += n

    def todo(self) -> str:
        """What the phase has to do: "10 shards' GNND and 45 pair merges", "2,400 rows"."""
        if self.parts:
            return " and ".join(f"{n:,} {part}" for part, n in self.parts.items() if n)
        return f"{self.total:,} {self.unit}"

    def line(self) -> str:
        elapsed = time.monotonic() - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        share = f"({100 * self.done / max(self.total, 1):.0f} %)"
        if self.parts:
            counts = ", ".join(f"{self.part_done[p]:,}/{n:,} {p}" for p, n in self.parts.items() if n)
            text = f"{self.name}: {counts} {share} in {human_duration(elapsed)}"
        else:
            text = f"{self.name}: {self.done:,}/{self.total:,} {self.unit} {share} in {human_duration(elapsed)}, "
            if rate >= 1 or not self.done:
                text += f"{rate:,.1f} {self.unit}/s"
            else:  # slow items (merges of big shards): time per item reads better than 0.0 items/s
                text += f"{human_duration(elapsed / self.done)} per {self.unit.removesuffix('s')}"
        if 0 < self.done < self.total:
            text += f", about {human_duration((self.total - self.done) / rate)} left"
        return text


Advance = Callable[..., None]  # advance(n) or advance(n, part): n more items (of ``part``) done


class Reporter:
    """Progress as log lines (scripts, logs, the API): every phase logs a line when it starts and one when it
    ends, whatever its length, and a line every ``every_s`` seconds in between. Notes are warnings. The
    interface the pipeline calls."""

    def __init__(self, every_s: float | None = None):
        self.every_s = log_every_s() if every_s is None else every_s

    @contextmanager
    def phase(self, name: str, total: int, unit: str, parts: dict[str, int] | None = None) -> Iterator[Advance]:
        count = _Count(name, total, unit, parts)
        stop = threading.Event()

        def tick() -> None:
            while self.every_s > 0 and not stop.wait(self.every_s):
                log.info(count.line())

        log.info("%s: %s to do", name, count.todo())
        ticker = threading.Thread(target=tick, daemon=True, name=f"progress-{name}")
        ticker.start()
        try:
            yield count.advance
        finally:
            stop.set()
            ticker.join()
        log.info(count.line())

    def note(self, text: str) -> None:
        log.warning(text)

    def info(self, text: str) -> None:
        """A line for people following the run (shown by the CLI, not by Python's default logging)."""
        log.info(text)


class RateColumn(ProgressColumn):
    """Items per second in the phase's own unit (rows/s, pairs/s), or seconds per item where slower than one a
    second (never "0 tasks/s"); where the phase mixes kinds of item, the count of each instead."""

    def render(self, task) -> Text:
        detail = task.fields.get("detail")
        if detail:
            return Text(detail, style="cyan")
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "it")
        if not speed:
            return Text(f"-- {unit}/s", style="cyan")
        if speed < 1:
            return Text(f"{human_duration(1 / speed)} per {unit.removesuffix('s')}", style="cyan")
        return Text(f"{speed:,.0f} {unit}/s", style="cyan")


class RichReporter(Reporter):
    """Progress bars on stderr, for people on a terminal; notes go through the logger as for ``Reporter``."""

    def __init__(self, console: Console | None = None):
        super().__init__()
        self.console = console or stderr_console()

    @contextmanager
    def phase(self, name: str, total: int, unit: str, parts: dict[str, int] | None = None) -> Iterator[Advance]:
        columns = (TextColumn("[bold]{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
                   RateColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        count = _Count(name, total, unit, parts)
        with Progress(*columns, console=self.console, transient=False) as bar:
            task = bar.add_task(name, total=total, unit=unit, detail=self._detail(count))

            def advance(n: int, part: str | None = None) -> None:
                count.advance(n, part)
                bar.update(task, advance=n, detail=self._detail(count))

            yield advance

    @staticmethod
    def _detail(count: _Count) -> str:
        return ", ".join(f"{count.part_done[p]:,}/{n:,} {p}" for p, n in count.parts.items() if n)


def reporter(progress: bool) -> Reporter:
    """Bars where ``progress`` (the API's ``progress=True``), log lines otherwise."""
    return RichReporter() if progress else Reporter()
