"""Exception types: one per kind of misuse, each naming what was wrong."""
from __future__ import annotations


class RollMuxError(Exception):
    """Base of every error RollMux raises on purpose. It pickles as raised, whatever its
    subclass's ``__init__`` takes (an error from a Ray task or a Serve replica reaches
    the caller as itself, not as Ray's ``UnserializableException``)."""

    def __reduce__(self) -> tuple:
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


def _rebuilt(cls: type, args: tuple, state: dict) -> RollMuxError:
    """``RollMuxError.__reduce__``'s inverse: the error with its message and attributes,
    without calling the subclass's ``__init__`` again."""
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


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


class TLSConfigError(RollMuxError, ValueError):
    """``rollmux serve``'s certificate and key cannot serve https; the message names the
    option (``--tls-cert``, ``--tls-key``) and why."""


class PlacementError(RollMuxError):
    """A placement was asked for that the state cannot take (unknown job, duplicate id)."""


class CapacityError(RollMuxError):
    """A simulated run could place no job at all: the bounded pools can never host the trace.

    ``pools`` names the pools that lacked nodes; the message names them, their inventory
    field (``rollout.nodes`` / ``train.nodes``) where the cluster bounds it, and a job's
    reason, which ``reason`` holds alone ("JOB: why it was not placed").
    """

    def __init__(self, policy: str, pools: tuple[str, ...], message: str, reason: str = "") -> None:
        self.policy = policy
        self.pools = pools
        self.reason = reason
        super().__init__(message)


class OutputPathError(RollMuxError):
    """An output path given on the command line cannot be written; raised before any work.

    The message names the option (``--json``, ``--out``), the path and why.
    """

    def __init__(self, option: str, path: object, why: str) -> None:
        self.option = option
        self.path = path
        super().__init__(f"{option} {path}: {why}")


class ReportError(SpecError):
    """A report was asked to show something the results do not hold: a Gantt group that
    ran no phase in the recorded spans, a Gantt window that is empty or holds none of
    its phases, no policy to report. ``field`` names the parameter (``gantt_group``,
    ``gantt_window``, ``results``); raised before any file is written."""


class FrameworkConfigError(SpecError):
    """A framework's own configuration (a veRL config) cannot run as a RollMux job, or
    cannot run on the placement it was given. ``field`` is the dotted path of the
    framework's field (``trainer.nnodes``, ``actor_rollout_ref.rollout.name``), ``where``
    names the framework; raised before any worker, pool or job is created."""


class DeviceUnavailableError(RollMuxError):
    """A feature that needs a CUDA device, or a GPU library, was used where it is missing.

    ``feature`` names what was asked for, ``missing`` what is absent (no CUDA device, a
    package not installed); raised before anything is allocated.
    """

    def __init__(self, feature: str, missing: str) -> None:
        self.feature = feature
        self.missing = missing
        super().__init__(f"{feature} needs {missing}")
