"""RollMux: the conservative inter-group planner (``rollmux.planner``).

``rollmux`` takes the first cheapest feasible candidate, as Algorithm 1 of the paper;
``rollmux-bestfit`` evaluates every candidate at the cheapest feasible cost and takes the
one that leaves its group best utilized; ``rollmux-consolidate`` also offers running jobs
a zero-cost move that gives nodes back (``Planner.repack``); ``rollmux-regroup`` in
addition re-solves a group that lost a job together with one other group, exactly, and
moves all their jobs when that is cheaper (``improve.plan_regroup``).
"""
from __future__ import annotations

from functools import partial

from rollmux.accounting import OURS, CostAccounting
from rollmux.improve import plan_regroup
from rollmux import colocation
from rollmux.model import Cluster, Job
from rollmux.plan_state import PlanState
from rollmux.planner import PAPER_SPACE, Decision, Planner, Space
from rollmux.policies.base import DisaggregatedTimes


class RollMuxPolicy:
    def __init__(self, tie_break: str = "first", name: str = "rollmux", consolidate: bool = False,
                 regroup: bool = False, accounting: CostAccounting = OURS, space: Space = PAPER_SPACE) -> None:
        self.name = name
        self.planner = Planner(tie_break=tie_break, accounting=accounting, space=space)
        self._colocated: set[str] = set()  # jobs placed co-located (their phases run on training GPUs)
        if consolidate:
            self.repack = self.planner.repack
        if regroup:
            self.regroup = partial(plan_regroup, one_node=accounting.one_node_per_pool,
                                   train_scaling=space.train_scaling)

    def place(self, state: PlanState, job: Job) -> Decision:
        decision = self.planner.decide(state, job)
        if decision.placement is not None and decision.placement.colocated:
            self._colocated.add(job.job_id)
        return decision

    def phase_time(self, job: Job, pool: str, cluster: Cluster) -> tuple[float, float]:
        """The profile on the job's own GPU types; ``rollmux.colocation``'s times for a job
        placed co-located (co-located groups are never regrouped or repacked)."""
        if job.job_id in self._colocated:
            return colocation.phase_time(job, pool, cluster)
        return DisaggregatedTimes.phase_time(job, pool, cluster)
