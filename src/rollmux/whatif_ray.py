"""Running a ``rollmux whatif`` grid on Ray: one task per (configuration, policy, line order).

Contract
--------
* ``run_grid`` connects the driver: to ``address`` when given (an existing cluster, its
  own auth settings), else to a new local Ray instance with ``num_cpus`` CPUs (default:
  the machine's, at most one per run) and ``RAY_AUTH_MODE=disabled`` unless the
  environment says otherwise. A driver already connected is used as it is. The driver
  is disconnected (and a local instance stopped) on return or error, unless it was
  connected before the call.
* The trace goes into the object store once (``ray.put``); each task runs
  ``whatif.run_config`` (one CPU) and returns its Row. Every configuration runs under
  every policy, and each of those under every waiting-line order of ``queues``
  (``backfill``, ``fifo``: ``run_config(backfill=)``). The rows come back in grid order
  (configurations in ``grid`` order, policies in the given order within each, orders in
  the given order within those), equal to a serial ``run_config`` of the same
  arguments. A fleet's ``base`` (a ``whatif_fleet.fleet_dict``) and its ``profiles`` go
  to every task with its arguments.
* ``on_row(row, done, total)`` is called on the driver as each run finishes.
* Without Ray installed, or when ``address`` cannot be reached, RollMuxError says so.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

from rollmux.accounting import OURS, CostAccounting
from rollmux.errors import RollMuxError
from rollmux.fleet import Profiles
from rollmux.model import Job
from rollmux.whatif import Row, run_config

_POLL_S = 0.2


def _connect(address: str | None, num_cpus: int) -> bool:
    """Connect the driver; True when this call did (so it should disconnect)."""
    try:
        import ray
    except ImportError:
        raise RollMuxError("rollmux whatif runs on Ray: pip install 'rollmux[ray]'") from None
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RollMuxError(f"cannot connect to the Ray cluster at {address}: {err}") from None
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from rollmux.runtime.ray_start import start_ray

        start_ray(lambda: ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False))
    return True


def run_grid(jobs: list[Job], base: dict, configs: list[dict], policies: list[str], *, seed: int = 0,
             duration_model: str = "worst", accounting: CostAccounting = OURS, address: str | None = None,
             num_cpus: int | None = None, profiles: Profiles | None = None,
             queues: Sequence[str] = ("backfill",),
             on_row: Callable[[Row, int, int], None] | None = None) -> list[Row]:
    """Simulate every configuration under every policy and line order on Ray; see the module contract."""
    runs = [(values, policy, queue) for values in configs for policy in policies for queue in queues]
    if not runs:
        return []
    cpus = num_cpus or min(os.cpu_count() or 1, len(runs))
    started = _connect(address, cpus)
    import ray

    try:
        trace = ray.put(jobs)
        task = ray.remote(num_cpus=1)(run_config)
        index = {task.remote(trace, base, values, policy, seed, duration_model, accounting, profiles,
                             queue == "backfill"): i
                 for i, (values, policy, queue) in enumerate(runs)}
        rows: list[Row | None] = [None] * len(runs)
        pending, done = list(index), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
            for ref in ready:
                row = rows[index[ref]] = ray.get(ref)
                done += 1
                if on_row is not None:
                    on_row(row, done, len(runs))
        return rows
    finally:
        if started:
            ray.shutdown()
