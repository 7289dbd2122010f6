"""RollMux: the conservative inter-group planner (``rollmux.planner``).

``rollmux`` takes the first cheapest feasible candidate, as Algorithm 1 of the paper;
``rollmux-bestfit`` evaluates every candidate at the cheapest feasible cost and takes the
one that leaves its group best utilized; ``rollmux-consolidate`` also offers the members
of a group that lost a job a zero-cost move that gives nodes back (``Planner.repack``).
"""
from __future__ import annotations

from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision, Planner
from rollmux.policies.base import DisaggregatedTimes


class RollMuxPolicy(DisaggregatedTimes):
    def __init__(self, tie_break: str = "first", name: str = "rollmux", consolidate: bool = False) -> None:
        self.name = name
        self.planner = Planner(tie_break=tie_break)
        if consolidate:
            self.repack = self.planner.repack

    def place(self, state: PlanState, job: Job) -> Decision:
        return self.planner.decide(state, job)
