"""Phase times of a job co-located on its training nodes (veRL-style time sharing).

A co-located job runs both phases on its ``ceil(train_gpus / gpus_per_node)`` training
nodes and holds no rollout node. Its rollout takes ``t_roll_colo_s`` when the trace gives
it, else ``t_roll_s`` scaled by the memory-bandwidth ratio of the two GPU types (decode
is bandwidth bound: H20 4.0 TB/s against H800 3.35 TB/s, x1.19) and by
``rollout_width_factor``: a job with more rollout GPUs than training GPUs generates the
same batch on fewer GPUs, rollout_gpus / train_gpus times longer (throughput in
proportion to GPUs, the worst case; no speed-up is claimed the other way). Training takes
``t_train_colo_s`` or ``t_train_s``. Every phase pays the warm switch of the job's model
in its pool (offload the other phase's state, load this one's), which is what veRL pays
between its rollout engine and its trainer; the execution rule charges no switch of its
own to a node that only ever runs one job, so the switch is part of the phase here.

Used by the co-located and Gavel+ baselines and by the planner's co-location option
(``rollmux.planner``), so all three see the same times.
"""
from __future__ import annotations

from rollmux.model import GPU_TYPES, POOLS, ROLLOUT, TRAIN, Cluster, Group, Job

_BANDWIDTH = 1  # index of TB/s in GPU_TYPES rows


def rollout_speed_factor(cluster: Cluster) -> float:
    """How much longer a rollout takes on the training GPU type than on the rollout type."""
    return GPU_TYPES[cluster.rollout.gpu][_BANDWIDTH] / GPU_TYPES[cluster.train.gpu][_BANDWIDTH]


def rollout_width_factor(job: Job) -> float:
    """How much longer ``job``'s rollout takes on its training GPUs than on its rollout
    GPUs, from their counts: rollout_gpus / train_gpus, at least 1 (module contract)."""
    return max(1.0, job.rollout_gpus / job.train_gpus)


def phase_time(job: Job, pool: str, cluster: Cluster) -> tuple[float, float]:
    """(worst-case body seconds, switch seconds) of ``job``'s ``pool`` phase when co-located;
    a job that only runs co-located (``Job.colocate``) has it as its profile, switches included."""
    if job.colocate:
        return (job.t_roll_s if pool == ROLLOUT else job.t_train_s), 0.0
    switch = cluster.switch_cost.seconds(job.model, pool)
    if pool == ROLLOUT:
        body = (job.t_roll_colo_s if job.t_roll_colo_s is not None
                else job.t_roll_s * rollout_speed_factor(cluster) * rollout_width_factor(job))
    else:
        body = job.t_train_colo_s if job.t_train_colo_s is not None else job.t_train_s
    return body, switch


def worst_phase(job: Job, pool: str, cluster: Cluster, colocated: bool) -> tuple[float, float]:
    """(worst-case body seconds, fixed overhead seconds) of ``job``'s ``pool`` phase in a group
    of that kind: the profile on the job's own GPU types, or the co-located times above.
    What every policy's phases take in the simulator (the kind of group is the policy's choice)."""
    if colocated:
        return phase_time(job, pool, cluster)
    return (job.t_roll_s if pool == ROLLOUT else job.t_train_s), 0.0


def node_mem_gb(job: Job) -> float:
    """Host memory a co-located job takes on each of its nodes: both phases' state."""
    return job.mem(ROLLOUT) + job.mem(TRAIN)


def fits(job: Job, cluster: Cluster) -> bool:
    """Whether ``job`` could run co-located on ``cluster`` at all: its training nodes could
    hold both phases' state (``node_mem_gb``), on a listed pool enough of its nodes. The
    baselines run a job that cannot disaggregated (``rollmux.policies``)."""
    mem, spec = node_mem_gb(job), cluster.pool(TRAIN)
    if spec.node_list:
        return sum(n.host_mem_gb >= mem for n in spec.node_list) >= job.nodes(TRAIN, cluster.gpus_per_node)
    return mem <= spec.host_mem_gb


def iteration_s(job: Job, cluster: Cluster) -> float:
    """One co-located iteration alone: both phases, each with its switch."""
    return sum(sum(phase_time(job, pool, cluster)) for pool in POOLS)


def slowdown(job: Job, cluster: Cluster) -> float:
    """The co-located iteration over the job's disaggregated solo iteration (its SLO basis)."""
    return iteration_s(job, cluster) / job.t_solo


def iteration_price(job: Job, cluster: Cluster, colocated: bool) -> float:
    """$ x s / h of node time ``job`` holds for one iteration alone: co-located on its
    training nodes (``iteration_s``), or solo on its own nodes of both pools (T_solo).
    Divided by 3600, the dollars of that iteration; what the Gavel+ baseline compares."""
    g = cluster.gpus_per_node
    if colocated:
        return iteration_s(job, cluster) * job.nodes(TRAIN, g) * cluster.node_price(TRAIN)
    return job.t_solo * sum(job.nodes(p, g) * cluster.node_price(p) for p in POOLS)


def effective_cost(group: Group, cluster: Cluster) -> float:
    """A group's $/h as the planner counts it: a co-located group's at its member's slowdown
    (its nodes are held that much longer per unit of work; ``rollmux.planner``)."""
    cost = group.cost_per_hour(cluster)
    if group.colocated and group.members:
        cost *= slowdown(group.members[0].job, cluster)
    return cost
