"""Solo disaggregation (Solo-D): every job on its own rollout and training nodes, 1:1."""
from __future__ import annotations

from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision
from rollmux.policies.base import isolated


class SoloDisaggregated:
    name = "solo-d"

    def place(self, state: PlanState, job: Job) -> Decision:
        return isolated(state, job)
