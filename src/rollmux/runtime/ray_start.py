"""Starting Ray on this machine, with a second chance when its start is slow.

Contract: ``start_ray(start)`` calls ``start()`` (anything that starts Ray processes here:
``ray.init(address="local", ...)``, a ``ray.cluster_utils.Cluster``) and returns its value.
Ray waits a fixed 30 s for a new node's raylet to register with the GCS, then raises a bare
``Exception`` ("The current node timed out during startup"); it also waits a fixed time for
the GCS server to write its port to a file, then raises ``RuntimeError("Timed out waiting
for file <path>")``. On a loaded 2-core machine, right after another Ray went down, either
happens now and then although nothing is wrong. When one does, the processes this attempt
started (those children of this process that did not exist before it) are killed and
reaped, and ``start()`` runs again, at most ``attempts`` times in all (tenacity). Every
other error passes through at once and untouched; the last timeout is re-raised as it came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import psutil
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_fixed

T = TypeVar("T")

_TIMED_OUT = "timed out during startup"
_PORT_FILE = "Timed out waiting for file "


def is_start_timeout(err: BaseException) -> bool:
    """True for Ray's start-up timeouts: the node's (a bare ``Exception`` known by its
    message) and the GCS port file's (a ``RuntimeError`` known by its message's start)."""
    return ((type(err) is Exception and _TIMED_OUT in str(err))
            or (type(err) is RuntimeError and str(err).startswith(_PORT_FILE)))


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _reap(existing: set[int]) -> None:
    """Kill the children of this process that are not in ``existing`` and wait for them."""
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in existing]
    for proc in new:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(new, timeout=10)


def start_ray(start: Callable[[], T], *, attempts: int = 3, wait_s: float = 1.0) -> T:
    """``start()``, retried after a start-up timeout; see the module contract."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")

    def attempt() -> T:
        existing = _children()
        try:
            return start()
        except Exception as err:
            if is_start_timeout(err):
                _ray_shutdown()
                _reap(existing)
            raise

    retrying = Retrying(stop=stop_after_attempt(attempts), wait=wait_fixed(wait_s),
                        retry=retry_if_exception(is_start_timeout), reraise=True)
    return retrying(attempt)


def _ray_shutdown() -> None:
    import ray

    ray.shutdown()
