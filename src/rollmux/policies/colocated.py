"""veRL-style co-location: each job time-shares its own training-type GPUs between phases.

The job gets ``ceil(train_gpus / gpus_per_node)`` training nodes and nothing in the
rollout pool; its phase times are ``rollmux.colocation``'s (rollout scaled by the
memory-bandwidth ratio unless the trace gives co-located times, a warm switch on every
phase). A job whose two phases' state fits no training node (``colocation.fits``) runs
disaggregated on its own nodes instead, as a platform would run it.
"""
from __future__ import annotations

from rollmux import colocation
from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision
from rollmux.policies.base import colocated_group, isolated


class Colocated:
    name = "colocated"

    def place(self, state: PlanState, job: Job) -> Decision:
        if job.colocate or colocation.fits(job, state.cluster):
            return colocated_group(state, job)
        return isolated(state, job, f"both phases' state ({colocation.node_mem_gb(job):g} GB a node) fits no "
                                    f"training node: disaggregated")
