"""Progress of long runs, with and without a terminal.

``progress_reporter(console, label, total)`` is a context manager yielding
``update(done)``, where ``done`` counts towards ``total`` (the simulator passes the jobs
arrived plus those finished so far, out of twice the jobs: each costs a decision, which
is where a long run's time goes, and a run's last stretch has departures only). On a
terminal it draws a Rich bar with elapsed time and ETA (it
disappears when the run ends). Without one (CI, a pipe, a log file) it prints a plain line
at most every ``every_s`` seconds of wall time, and a last one at the end if it printed
any (a short run prints nothing):

    rollmux: 42.0% in 12.3 s, 3.4%/s, ETA 16.9 s

The ETA assumes the rate so far holds for the rest.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

EVERY_S = 5.0


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes}m{sec:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


class _Lines:
    """The terminal-less reporter: one line per ``every_s`` seconds of wall time."""

    def __init__(self, console: Console, label: str, total: float, every_s: float,
                 clock: Callable[[], float]) -> None:
        self.console, self.label, self.total, self.every_s, self.clock = console, label, total, every_s, clock
        self.start = self.last = clock()
        self.done = 0.0
        self.printed = False
        self.shown = 0.0  # ``done`` at the last line printed

    def line(self) -> str:
        elapsed = self.clock() - self.start
        share = min(1.0, self.done / self.total) if self.total > 0 else 1.0
        text = f"{escape(self.label)}: {100 * share:.1f}% in {_duration(elapsed)}"
        if 0 < share < 1 and elapsed > 0:
            rate = share / elapsed
            text += f", {100 * rate:.1f}%/s, ETA {_duration((1 - share) / rate)}"
        return text

    def update(self, done: float) -> None:
        self.done = done
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            self.printed, self.shown = True, done
            self.console.print(self.line(), highlight=False)


@contextmanager
def progress_reporter(console: Console, label: str, total: float, every_s: float = EVERY_S,
                      clock: Callable[[], float] = time.monotonic) -> Iterator[Callable[[float], None]]:
    """Report progress of one run; see the module docstring."""
    if console.is_terminal:
        with Progress(TextColumn("{task.description:>10}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                      transient=True) as bar:
            task = bar.add_task(escape(label), total=total or 1.0)
            yield lambda done: bar.update(task, completed=done)
        return
    lines = _Lines(console, label, total, every_s, clock)
    yield lines.update
    if lines.printed and lines.shown < total:  # (a last update may have printed 100% already)
        lines.done = total
        console.print(lines.line(), highlight=False)
