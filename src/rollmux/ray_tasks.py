"""Independent CPU work as Ray tasks: the driver's connection and an ordered map.

Contract
--------
* ``connect(address, num_cpus, command)`` connects the driver: to ``address`` when given
  (an existing cluster, its own auth settings), else to a new local Ray instance with
  ``num_cpus`` CPUs and ``RAY_AUTH_MODE=disabled`` unless the environment says otherwise
  (its start retried after Ray's start-up timeouts, ``runtime.ray_start``). It returns
  True when this call connected (so the caller disconnects), False when a driver was
  connected already. Without Ray installed, or when ``address`` cannot be reached
  (``HOST:PORT`` refusing a TCP connection within 5 s is refused at once),
  ``RollMuxError`` names ``command``. A local instance is new even when another Ray
  cluster runs on the machine.
* ``map_tasks(fn, shared, items, ...)`` runs ``fn(*shared, *item)`` for every item as a
  Ray task of one CPU and returns the results in item order, each equal to the call made
  in this process. ``fn`` is any picklable callable that Ray's workers can load (a
  module-level function, a builtin, a ``functools.partial`` of one). It and each element
  of ``shared`` go into the object store once, however many tasks read them.
  ``on_done(index, result, done, total)`` is called on the driver as each task finishes
  (in finishing order); ``on_wait(done, total)`` after each poll (every 0.2 s) in which
  none did (a display's heartbeat while long tasks run). A local instance gets one CPU per item unless
  ``num_cpus`` says otherwise, at most the machine's. The driver is disconnected (and a
  local instance stopped) on return or error, unless it was connected before the call.
  A task's exception is raised on the driver as Ray reports it.
* ``serial_map`` makes the same calls one after the other in this process (``Mapper``:
  either one).
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any, Callable, Sequence

from rollmux.errors import RollMuxError

_POLL_S = 0.2


def connect(address: str | None, num_cpus: int, command: str) -> bool:
    """Connect the driver; True when this call did (so it should disconnect). See the module contract."""
    try:
        import ray
    except ImportError:
        raise RollMuxError(f"{command} runs on Ray: pip install 'rollmux[ray]'") from None
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        _check_reachable(address, command)
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RollMuxError(f"{command}: cannot connect to the Ray cluster at {address}: {err}") from None
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from rollmux.runtime.ray_start import start_ray

        # address="local": a new instance even when another Ray cluster runs on this machine
        # (``ray start --head``, a test's cluster, or the stale address file a killed one left)
        start_ray(lambda: ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                                   log_to_driver=False, logging_level=logging.WARNING))
    return True


def _check_reachable(address: str, command: str, timeout_s: float = 5.0) -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) address that refuses a TCP connection within
    ``timeout_s``: RollMuxError now (``ray.init`` retries such an address for minutes)."""
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit() or "/" in where:
        return  # "auto", a scheme Ray knows: Ray's own errors say
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise RollMuxError(f"{command}: cannot connect to the Ray cluster at {address}: nothing answers on "
                           f"{host}:{port} within {timeout_s:g}s ({err})") from None


#: A map of independent calls: ``mapper(fn, shared, items, on_done=)`` returns
#: ``[fn(*shared, *item) for item in items]`` and calls ``on_done(index, result, done,
#: total)`` as each finishes; ``serial_map`` here, ``map_tasks`` on Ray (with its
#: connection keywords bound, e.g. by ``functools.partial``).
Mapper = Callable[..., list]


def serial_map(fn: Callable[..., Any], shared: Sequence[Any], items: Sequence[Sequence[Any]],
               on_done: Callable[[int, Any, int, int], None] | None = None) -> list[Any]:
    """``map_tasks``' calls one after the other in this process."""
    out = []
    for i, item in enumerate(items):
        out.append(fn(*shared, *item))
        if on_done is not None:
            on_done(i, out[-1], i + 1, len(items))
    return out


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """A task's body: ``fn`` may be any picklable callable (a builtin, a ``functools.partial``)."""
    return fn(*args)


def map_tasks(fn: Callable[..., Any], shared: Sequence[Any], items: Sequence[Sequence[Any]], *,
              command: str, address: str | None = None, num_cpus: int | None = None,
              on_done: Callable[[int, Any, int, int], None] | None = None,
              on_wait: Callable[[int, int], None] | None = None) -> list[Any]:
    """``[fn(*shared, *item) for item in items]``, each call a Ray task; see the module contract."""
    if not items:
        return []
    cpus = num_cpus or min(os.cpu_count() or 1, len(items))
    started = connect(address, cpus, command)
    import ray

    try:
        refs = [ray.put(value) for value in (fn, *shared)]
        task = ray.remote(num_cpus=1)(_call)
        index = {task.remote(*refs, *item): i for i, item in enumerate(items)}
        results: list[Any] = [None] * len(items)
        pending, done = list(index), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
            if not ready and on_wait is not None:
                on_wait(done, len(items))
            for ref in ready:
                i = index[ref]
                results[i] = ray.get(ref)
                done += 1
                if on_done is not None:
                    on_done(i, results[i], done, len(items))
        return results
    finally:
        if started:
            ray.shutdown()
