"""veRL-style co-location: each job time-shares its own training-type GPUs between phases.

The job gets ``ceil(train_gpus / gpus_per_node)`` training nodes and nothing in the
rollout pool; its phase times are ``rollmux.colocation``'s (rollout scaled by the
memory-bandwidth ratio unless the trace gives co-located times, a warm switch on every
phase).
"""
from __future__ import annotations

from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision
from rollmux.policies.base import colocated_group


class Colocated:
    name = "colocated"

    def place(self, state: PlanState, job: Job) -> Decision:
        return colocated_group(state, job)
