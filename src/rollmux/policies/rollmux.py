"""RollMux: the conservative inter-group planner (``rollmux.planner``).

``rollmux`` uses the best-fit tie break among the cheapest feasible candidates;
``alg1`` is the paper's Algorithm 1 as published (first cheapest feasible candidate).
"""
from __future__ import annotations

from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision, Planner
from rollmux.policies.base import DisaggregatedTimes


class RollMuxPolicy(DisaggregatedTimes):
    def __init__(self, tie_break: str = "best-fit", name: str = "rollmux") -> None:
        self.name = name
        self.planner = Planner(tie_break=tie_break)

    def place(self, state: PlanState, job: Job) -> Decision:
        return self.planner.decide(state, job)
