"""Most-Idle greedy: pack the job into the group with the most idle GPU time per
meta-iteration (residency and group size honoured, SLOs not checked), else open a new
group. Idle time of a group = sum over pools of (1 - U_pool) x period x GPUs of the pool."""
from __future__ import annotations

from rollmux.model import POOLS, Job
from rollmux.plan_state import PlanState
from rollmux.planner import Decision
from rollmux.policies.base import isolated, packable, packed


def idle_gpu_seconds(state: PlanState, group_id: str) -> float:
    a = state.analysis(group_id)
    group = state.groups[group_id]
    gpn = state.cluster.gpus_per_node
    return sum((1.0 - a.utilization[p]) * a.period * len(group.nodes(p)) * gpn for p in POOLS)


class MostIdle:
    name = "most-idle"

    def place(self, state: PlanState, job: Job) -> Decision:
        options = packable(state, job)
        if not options:
            return isolated(state, job, "no group has room")
        best = max(options, key=lambda p: idle_gpu_seconds(state, p.group_id))
        return packed(job, best, "group with the most idle GPU time")
