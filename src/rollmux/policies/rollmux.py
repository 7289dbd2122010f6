"""RollMux: the conservative inter-group planner (``rollmux.planner``).

``rollmux`` takes the first cheapest feasible candidate, as Algorithm 1 of the paper;
``rollmux-bestfit`` evaluates every candidate at the cheapest feasible cost and takes the
one that leaves its group best utilized (measured: no better on the bundled traces).
"""
from __future__ import annotations

from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision, Planner
from rollmux.policies.base import DisaggregatedTimes


class RollMuxPolicy(DisaggregatedTimes):
    def __init__(self, tie_break: str = "first", name: str = "rollmux") -> None:
        self.name = name
        self.planner = Planner(tie_break=tie_break)

    def place(self, state: PlanState, job: Job) -> Decision:
        return self.planner.decide(state, job)
