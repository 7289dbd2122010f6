"""Exception types: one per kind of misuse, each naming what was wrong."""
from __future__ import annotations


class RollMuxError(Exception):
    """Base of every error RollMux raises on purpose."""


class SpecError(RollMuxError, ValueError):
    """A job or cluster field holds a value outside its contract.

    The message names the field, the offending value and what was expected, and the
    error is raised before any state changes.
    """

    def __init__(self, field: str, value: object, expected: str, where: str = "") -> None:
        self.field = field
        self.value = value
        self.expected = expected
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{field}={value!r}: expected {expected}")


class TraceFormatError(RollMuxError, ValueError):
    """A trace or cluster file cannot be parsed; names file, line and column."""

    def __init__(self, path: str, line: int, column: str, message: str) -> None:
        self.path = path
        self.line = line
        self.column = column
        col = f", column {column!r}" if column else ""
        super().__init__(f"{path}, line {line}{col}: {message}")


class PlacementError(RollMuxError):
    """A placement was asked for that the state cannot take (unknown job, duplicate id)."""
