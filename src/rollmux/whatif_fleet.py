"""``rollmux whatif`` on a fleet file: the base dict, the policies, one run and its owned cost.

Contract
--------
* ``fleet_dict(raw)``: a fleet file's mapping (``pools`` list) as the base dict that
  ``whatif.parse_vary`` varies: every pool with every key filled in (``name`` defaults
  to the GPU type, figures to the built-in table), and the fleet-level ``reference``,
  ``gpus_per_node``, ``switch_cost_s`` and ``max_group_size``; ``fleet_from_dict`` of it
  is the same fleet. SpecError as ``fleet_file.fleet_from_dict`` raises it.
* ``policy_names(base, profiles)``: the names of ``policies.fleet.fleet_policies`` on that
  fleet, in its order (``rollmux``, ``rollmux-full``, ..., ``gavel+``).
* ``run_fleet_config(...)``: ``rollmux.sim.engine.simulate`` of the trace on the fleet
  ``base`` with ``values`` set, under the fleet policy named ``policy`` (as ``rollmux
  fleet simulate`` runs it: this project's accounting), as a ``whatif.Row``. A fleet the
  file refuses, or a replay that places no job (CapacityError), is a Row with ``error``;
  a policy name not among ``policy_names`` raises SpecError("policy", name, ...), an
  accounting other than ``OURS`` SpecError("accounting", ...) (``check_accounting``).
* Owned cost: every node of each bounded pool at its price for the whole makespan, plus
  each unbounded pool's used cost: its nodes held by some group, integrated over the
  replay (``PolicyResult.pool_gpu_seconds``), which is ``fleet_owned_cost``; the Row adds
  the shared reward pool's bill (``whatif.result_row``), so with every pool unbounded
  owned equals used. Per pool, the used cost of all pools together is the replay's node
  cost (``PolicyResult.used_cost`` less the reward bill).
"""
from __future__ import annotations

import dataclasses

from rollmux.accounting import OURS, CostAccounting
from rollmux.errors import RollMuxError, SpecError
from rollmux.fleet import Fleet, Profiles
from rollmux.fleet_file import fleet_from_dict
from rollmux.model import Job
from rollmux.whatif import Row, order, result_row, with_values


def fleet_dict(raw: dict) -> dict:
    """The fleet file mapping ``raw`` with every default filled in; see the module contract."""
    fleet = fleet_from_dict(raw)
    pools = [{"name": p.name, "gpu": p.gpu, "price_per_gpu_hour": p.price_per_gpu_hour, "tflops": p.tflops,
              "tb_per_s": p.tb_per_s, "host_mem_gb": p.host_mem_gb, "nodes": p.nodes, "roles": list(p.roles)}
             for p in fleet.pools]
    return {"pools": pools, "reference": {"rollout": fleet.reference[0], "train": fleet.reference[1]},
            "gpus_per_node": fleet.gpus_per_node, "switch_cost_s": raw.get("switch_cost_s", fleet.switch_cost.mode),
            "max_group_size": fleet.max_group_size}


def _policies(fleet: Fleet, profiles: Profiles | None) -> list:
    from rollmux.policies.fleet import fleet_policies

    return fleet_policies(fleet, profiles if profiles is not None else Profiles())


def policy_names(base: dict, profiles: Profiles | None = None) -> list[str]:
    """The fleet policies' names on the fleet ``base`` (a ``fleet_dict``)."""
    return [p.name for p in _policies(fleet_from_dict(base), profiles)]


def fleet_policy(fleet: Fleet, profiles: Profiles | None, name: str):
    """The policy of ``fleet_policies`` named ``name``; SpecError("policy", ...) listing the names otherwise."""
    policies = _policies(fleet, profiles)
    for policy in policies:
        if policy.name == name:
            return policy
    raise SpecError("policy", name, f"a fleet policy: one of {', '.join(p.name for p in policies)}")


def check_accounting(accounting: CostAccounting) -> None:
    """SpecError("accounting", ...) unless ``accounting`` is this project's (``OURS``): fleet
    policies plan, and ``rollmux fleet simulate`` replays, under it only."""
    if accounting != OURS:
        raise SpecError("accounting", accounting.name, "ours with a fleet file (fleet policies plan and are "
                                                       "replayed under this project's accounting)")


def fleet_owned_cost(fleet: Fleet, span_s: float, gpu_seconds: dict[str, float]) -> float:
    """$ of holding every node of each bounded pool for ``span_s`` seconds, plus each
    unbounded pool's held GPU-seconds (fleet pool name -> seconds) at its price."""
    cost = 0.0
    for pool in fleet.pools:
        if pool.nodes is not None:
            cost += pool.nodes * fleet.gpus_per_node * pool.price_per_gpu_hour * span_s / 3600.0
        else:
            cost += gpu_seconds.get(pool.name, 0.0) * pool.price_per_gpu_hour / 3600.0
    return cost


def run_fleet_config(jobs: list[Job], base: dict, values: dict, policy: str, seed: int, duration_model: str,
                     profiles: Profiles | None = None, accounting: CostAccounting = OURS,
                     backfill: bool = True) -> Row:
    """Simulate ``jobs`` on the fleet ``base`` with ``values`` set, under ``policy``; see the module contract.
    ``backfill``: the waiting line's order on bounded pools (``simulate(backfill=)``)."""
    from rollmux.sim.engine import simulate

    check_accounting(accounting)
    try:
        fleet = fleet_from_dict(with_values(base, values))
    except SpecError as err:
        return Row(values, policy, error=str(err), queue=order(backfill))
    chosen = fleet_policy(fleet, profiles, policy)  # an unknown name is the caller's error, not a row's
    try:
        result = simulate(jobs, fleet.views()[0].cluster, chosen, duration_model, seed, backfill=backfill)
    except RollMuxError as err:
        return Row(values, policy, error=str(err), queue=order(backfill))
    owned = fleet_owned_cost(fleet, result.span_s, result.pool_gpu_seconds)
    # (the replay's binding pool is a role of its first view, "rollout" or "train", which names
    # no pool of a fleet: the limits column says "-", as docs/whatif.md has it)
    return dataclasses.replace(result_row(values, policy, result, owned, order(backfill)), limiting_pool=None)
