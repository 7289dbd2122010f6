"""Running a ``rollmux whatif`` grid on Ray: one task per (configuration, policy, line order).

Contract
--------
* ``run_grid`` connects the driver as ``rollmux.ray_tasks.map_tasks`` does (``address``,
  or a local instance of ``num_cpus`` CPUs, default the machine's, at most one per run),
  and disconnects it the same way.
* The trace and the base go into the object store once; each task runs
  ``whatif.run_config`` (one CPU) and returns its Row. Every configuration runs under
  every policy, and each of those under every waiting-line order of ``queues``
  (``backfill``, ``fifo``: ``run_config(backfill=)``). The rows come back in grid order
  (configurations in ``grid`` order, policies in the given order within each, orders in
  the given order within those), equal to a serial ``run_config`` of the same
  arguments. A fleet's ``base`` is a ``whatif_fleet.fleet_dict``; its ``profiles`` go
  to every task with its arguments.
* ``on_row(row, done, total)`` is called on the driver as each run finishes, and
  ``on_wait(done, total)`` every 0.2 s while none does (``map_tasks``).
* Without Ray installed, or when ``address`` cannot be reached, RollMuxError says so.
"""
from __future__ import annotations

from typing import Callable, Sequence

from rollmux.accounting import OURS, CostAccounting
from rollmux.fleet import Profiles
from rollmux.model import Job
from rollmux.ray_tasks import map_tasks
from rollmux.whatif import Row, run_config


def run_grid(jobs: list[Job], base: dict, configs: list[dict], policies: list[str], *, seed: int = 0,
             duration_model: str = "worst", accounting: CostAccounting = OURS, address: str | None = None,
             num_cpus: int | None = None, profiles: Profiles | None = None,
             queues: Sequence[str] = ("backfill",),
             on_row: Callable[[Row, int, int], None] | None = None,
             on_wait: Callable[[int, int], None] | None = None) -> list[Row]:
    """Simulate every configuration under every policy and line order on Ray; see the module contract."""
    runs = [(values, policy, seed, duration_model, accounting, profiles, queue == "backfill")
            for values in configs for policy in policies for queue in queues]
    return map_tasks(run_config, (jobs, base), runs, command="rollmux whatif", address=address,
                     num_cpus=num_cpus, on_wait=on_wait,
                     on_done=None if on_row is None else lambda i, row, done, total: on_row(row, done, total))
