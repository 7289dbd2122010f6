"""veRL-style co-location: each job time-shares its own training-type GPUs between phases.

The job gets ``ceil(train_gpus / gpus_per_node)`` training nodes and nothing in the
rollout pool. Its rollout runs on those nodes: ``t_roll_colo_s`` when the trace gives it,
otherwise ``t_roll_s`` scaled by the memory-bandwidth ratio of the two GPU types
(rollout is bandwidth bound: H20 4.0 TB/s vs H800 3.35 TB/s, so x1.19). Training takes
``t_train_colo_s`` or ``t_train_s``. Every phase pays the warm switch of the job's model
size in its pool (offload the other phase's state, load this one's), the cost veRL
pays when it moves between its rollout engine and its trainer.
"""
from __future__ import annotations

from rollmux.model import GPU_TYPES, ROLLOUT, TRAIN, Cluster, Job
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import NEW, Candidate, Decision
from rollmux.policies.base import beyond_inventory

_BANDWIDTH = 1


def rollout_speed_factor(cluster: Cluster) -> float:
    """How much longer a rollout takes on the training GPU type than on the rollout type."""
    return GPU_TYPES[cluster.rollout.gpu][_BANDWIDTH] / GPU_TYPES[cluster.train.gpu][_BANDWIDTH]


class Colocated:
    name = "colocated"

    def place(self, state: PlanState, job: Job) -> Decision:
        need = job.nodes(TRAIN, state.cluster.gpus_per_node)
        never = beyond_inventory(state, job, {TRAIN: need})
        if never is not None:
            return never
        ids = state.peek_new(TRAIN, need, job.mem_roll_gb + job.mem_train_gb)
        if ids is None:
            return Decision(job.job_id, "wait", None, 0.0, (), "no free training nodes", (TRAIN,))
        placement = Placement(None, ids, ids, (), ids, colocated=True)
        cost = need * state.cluster.node_price(TRAIN)
        return Decision(job.job_id, "new-group", placement, cost, (Candidate(NEW, None, placement, cost, "chosen"),))

    @staticmethod
    def phase_time(job: Job, pool: str, cluster: Cluster) -> tuple[float, float]:
        switch = cluster.switch_cost.seconds(job.model, pool)
        if pool == ROLLOUT:
            body = job.t_roll_colo_s if job.t_roll_colo_s is not None else job.t_roll_s * rollout_speed_factor(cluster)
        else:
            body = job.t_train_colo_s if job.t_train_colo_s is not None else job.t_train_s
        return body, switch
