"""What every ``rollmux`` command prints through: one console, errors in the command's
words, JSON reports. User strings are escaped before Rich sees them."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from rollmux.errors import RollMuxError, SpecError

console = Console(width=None if sys.stdout.isatty() else 150)
#: progress of long runs (``rollmux.report.progress``) goes to stderr, so that a table or
#: report redirected to a file holds only itself; unwrapped, so that each line of progress
#: is one line in a log (a terminal's bar is drawn to its width all the same)
progress_console = Console(stderr=True, soft_wrap=True)
#: errors go to stderr too, unwrapped (one line per error, whole, for logs and grep)
error_console = Console(stderr=True, soft_wrap=True)


def fail(err: Exception, options: dict[str, str] | None = None) -> None:
    """Print ``err`` on stderr and exit with status 2. A SpecError about a parameter in ``options``
    (parameter name -> option name) is worded with the option's name."""
    message = str(err)
    if isinstance(err, SpecError) and not err.where and options and err.field in options:
        message = f"{options[err.field]} {err.value!r}: expected {err.expected}"
    error_console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)


def cluster_option(load, path):
    """``load(path)`` (a cluster or fleet file's loader) with a SpecError prefixed by
    ``--cluster FILE``, so an error names the file it is in."""
    try:
        return load(path)
    except SpecError as err:
        raise RollMuxError(f"--cluster {path}: {err}") from None


def write_json(path: Path, payload) -> None:
    """Write ``payload`` as JSON at ``path`` (the ``--json`` option), creating its folder."""
    from rollmux.report.paths import write_json as write

    try:
        write(path, payload)
    except RollMuxError as err:
        fail(err)
    console.print(f"wrote {escape(str(path))}")


@contextlib.contextmanager
def first_interrupt_stops(what: str) -> Iterator[threading.Event]:
    """Within: the first Ctrl-C (SIGINT) only sets the event yielded and says on stderr that
    ``what`` (e.g. "improving stops after the exact solve under way"); a second one raises
    ``KeyboardInterrupt`` as usual. The previous handler is back on exit. Off the main
    thread (where no handler can be set) the event is never set."""
    seen = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def on_interrupt(signum, frame) -> None:
        if seen.is_set():
            raise KeyboardInterrupt
        seen.set()
        progress_console.print(f"Ctrl-C: {what}; press Ctrl-C again to abort", highlight=False)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)
