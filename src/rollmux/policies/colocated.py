"""veRL-style co-location: each job time-shares its own training-type GPUs between phases.

The job gets ``ceil(train_gpus / gpus_per_node)`` training nodes and nothing in the
rollout pool; its phase times are ``rollmux.colocation``'s (rollout scaled by the
memory-bandwidth ratio unless the trace gives co-located times, a warm switch on every
phase).
"""
from __future__ import annotations

from rollmux import colocation
from rollmux.model import TRAIN, Job
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import NEW, Candidate, Decision
from rollmux.policies.base import beyond_inventory


class Colocated:
    name = "colocated"

    def place(self, state: PlanState, job: Job) -> Decision:
        need = job.nodes(TRAIN, state.cluster.gpus_per_node)
        never = beyond_inventory(state, job, {TRAIN: need})
        if never is not None:
            return never
        ids = state.peek_new(TRAIN, need, colocation.node_mem_gb(job))
        if ids is None:
            return Decision(job.job_id, "wait", None, 0.0, (), "no free training nodes", (TRAIN,))
        placement = Placement(None, ids, ids, (), ids, colocated=True)
        cost = need * state.cluster.node_price(TRAIN)
        return Decision(job.job_id, "new-group", placement, cost, (Candidate(NEW, None, placement, cost, "chosen"),))
