"""Whose accounting a simulation uses: ours (the default) or the paper authors'.

``rollmux simulate --accounting ours|paper|paper-widths``. Every field of ``CostAccounting`` is one
modelling choice, named for what it changes; ``OURS`` keeps every choice this project
makes (and every number it has printed), ``PAPER`` switches on the choices of the
authors' public simulator (github wutianyuan1/ROLL, ``global_scheduler/``; the facts in
/work/shared/reference/rollmux-facts.md sections 2, 4, 6, 7 and 9):

* ``fixed_departures`` - a job leaves at arrival + ``duration_s`` (the departure time
  the trace records, ``wild.trace``), whatever its slowdown: it keeps iterating until
  then and does less work when slowed. Ours: it runs all its iterations
  (``Job.solo_iterations``) and leaves after the last, so every policy does the same
  work. $/h is then total cost over the trace's own span (first arrival to last
  recorded departure, 370.156 h on ``production``) instead of the solo span.
* ``switch_cost`` - charge the warm-switch seconds of facts section 7 when a node
  changes job. Paper: no switch cost (``SwitchCost("fixed", 0, 0)``).
* ``host_memory_limit`` - the residency constraint of facts section 4 (host memory
  per node, Table 2 figures). Paper: no limit (host memory infinite), so a job too
  large for a node's memory is still placed.
* ``one_node_per_pool`` - RollMux's planner gives every job one rollout node and one
  training node (the authors' Weave simulator pins each job to one node of each pool;
  on ``production`` this changes only the 32B jobs, 2+2 -> 1+1 nodes, phase times
  unchanged). Baselines keep the trace's widths, as the authors' Naive-D and veRL do.
  Ours: the trace's widths (32B jobs on 2+2 nodes).
* ``saturation_gate`` - a saturated group (T_load >= T_cycle, facts section 5) takes no
  new job. Paper: no such gate (their planner tries every group that is not full).
* ``whole_run_slo_checks`` - the planner's SLO test also covers every group that
  departures could leave behind and a short job's start-up (``rollmux.planner``). Paper:
  their SLO test, which checks the group with the newcomer as it is (steady state).
* ``rollout_price_ratio`` - a rollout node priced at this fraction of a training node.
  Paper: 1/3 (their unit is H800-node-seconds; a rollout node counts 1/3), converted
  to dollars as units x $42.24 / 3600 (an H800 node at 8 x $5.28 an hour), so a rollout
  node costs $14.08/h against our 8 x $1.85 = $14.80/h. ``None``: the cluster's prices.

``PAPER_WIDTHS`` is ``PAPER`` with ``one_node_per_pool`` off: the authors' accounting at
the trace's widths, where their Weave costs $572.0/h on ``production``.

``units(total_cost, cluster)`` gives a run's cost back in the authors' unit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rollmux.model import TRAIN, Cluster, Job, SwitchCost


@dataclass(frozen=True, slots=True)
class CostAccounting:
    """One documented switch per modelling choice; see the module docstring."""

    name: str
    fixed_departures: bool = False
    switch_cost: bool = True
    host_memory_limit: bool = True
    one_node_per_pool: bool = False
    saturation_gate: bool = True
    whole_run_slo_checks: bool = True
    rollout_price_ratio: float | None = None

    def apply_cluster(self, cluster: Cluster) -> Cluster:
        """The cluster as this accounting sees it (prices, host memory, switch cost)."""
        out = cluster
        if not self.switch_cost:
            out = replace(out, switch_cost=SwitchCost("fixed", 0.0, 0.0))
        if not self.host_memory_limit:
            out = replace(out, rollout=replace(out.rollout, host_mem_gb=math.inf),
                          train=replace(out.train, host_mem_gb=math.inf))
        if self.rollout_price_ratio is not None:
            price = out.train.price_per_gpu_hour * self.rollout_price_ratio
            out = replace(out, rollout=replace(out.rollout, price_per_gpu_hour=price))
        return out

    def units(self, total_cost: float, cluster: Cluster) -> float:
        """``total_cost`` in training-node-seconds (the authors' unit: H800-node-seconds)."""
        return total_cost * 3600.0 / cluster.node_price(TRAIN)

    def to_dict(self) -> dict:
        return {"name": self.name, "fixed_departures": self.fixed_departures, "switch_cost": self.switch_cost,
                "host_memory_limit": self.host_memory_limit, "one_node_per_pool": self.one_node_per_pool,
                "saturation_gate": self.saturation_gate, "whole_run_slo_checks": self.whole_run_slo_checks,
                "rollout_price_ratio": self.rollout_price_ratio}


OURS = CostAccounting("ours")
PAPER = CostAccounting("paper", fixed_departures=True, switch_cost=False, host_memory_limit=False,
                       one_node_per_pool=True, saturation_gate=False, whole_run_slo_checks=False,
                       rollout_price_ratio=1 / 3)
#: The authors' accounting at the trace's widths (32B jobs on 2+2 nodes for RollMux too):
#: what their Weave costs at equal widths, $572.0/h on ``production`` (docs/reproduce.md).
PAPER_WIDTHS = replace(PAPER, name="paper-widths", one_node_per_pool=False)
ACCOUNTINGS = {a.name: a for a in (OURS, PAPER, PAPER_WIDTHS)}


def departure_span_s(jobs: list[Job]) -> float:
    """First arrival to the last recorded departure (arrival + duration; a job without a
    duration: arrival + its solo run time, ``Job.solo_run_s``)."""
    if not jobs:
        return 0.0
    return max(j.arrival_s + leave_after_s(j) for j in jobs) - min(j.arrival_s for j in jobs)


def leave_after_s(job: Job) -> float:
    """Seconds after arrival at which a job leaves under fixed departures."""
    return job.duration_s if job.duration_s is not None else job.solo_run_s(job.solo_iterations())
