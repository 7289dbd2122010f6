"""The interface every placement policy implements, and what they share.

A policy is strategy only: given the current ``PlanState`` and an arriving job it returns
a ``Decision`` (it never mutates the state). How long a phase takes follows from the
kind of group the decision puts the job in (``rollmux.colocation.worst_phase``: the
profile, or co-located times on the training GPU type). The simulator and the live
service carry decisions out.
"""
from __future__ import annotations

from typing import Protocol

from rollmux import colocation
from rollmux.model import POOLS, ROLLOUT, TRAIN, Job
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import NEW, Candidate, Decision, node_choices


class Policy(Protocol):
    name: str

    def place(self, state: PlanState, job: Job) -> Decision:
        """Where ``job`` goes now (or that it waits); pure."""

    # Optional: ``repack(state, job_id, remaining, spare_s, progress) -> Decision | None`` offers a
    # running job a consolidating move (see ``Planner.repack``); the simulator calls it
    # when the policy has it. Likewise ``regroup(state, group_id, progress, pause_s) ->
    # RegroupPlan | None`` (see ``improve.plan_regroup``), after a departure. A policy with
    # ``uses_remaining`` true takes ``place(state, job, remaining)``: the iterations each job
    # has left, by id (``rollmux.lifetime``).


def beyond_inventory(state: PlanState, job: Job, need: dict[str, int]) -> Decision | None:
    """The rejection of a job that needs more nodes of a bounded pool than the pool has
    (waiting would block the queue behind it for ever), else None."""
    for pool, count in need.items():
        total = state.cluster.pool(pool).nodes
        if total is not None and count > total:
            return Decision(job.job_id, "rejected", None, 0.0, (), f"needs {count} {pool} nodes, the pool has {total}",
                            (pool,))
    return None


def colocated_group(state: PlanState, job: Job) -> Decision:
    """A new co-located group of the job's own training nodes (room for both phases' state),
    a wait if the free nodes are short, or a rejection if the inventory is."""
    need = job.nodes(TRAIN, state.cluster.gpus_per_node)
    never = beyond_inventory(state, job, {TRAIN: need})
    if never is not None:
        return never
    ids = state.peek_new(TRAIN, need, colocation.node_mem_gb(job))
    if ids is None:
        return Decision(job.job_id, "wait", None, 0.0, (), "no free training nodes", (TRAIN,))
    placement = Placement.colocated_on(ids)
    cost = need * state.cluster.node_price(TRAIN)
    return Decision(job.job_id, "new-group", placement, cost, (Candidate(NEW, None, placement, cost, "chosen"),))


def isolated(state: PlanState, job: Job, reason: str = "") -> Decision:
    """A new group of the job's own nodes in both pools (co-located for a job that only runs
    so, ``Job.colocate``), a wait if the free nodes are short, or a rejection if the
    inventory is (``beyond_inventory``)."""
    if job.colocate:
        return colocated_group(state, job)
    cluster = state.cluster
    need = {p: job.nodes(p, cluster.gpus_per_node) for p in POOLS}
    never = beyond_inventory(state, job, need)
    if never is not None:
        return never
    ids = {p: state.peek_new(p, need[p], job.mem(p)) for p in POOLS}
    if any(v is None for v in ids.values()):
        short = tuple(p for p in POOLS if ids[p] is None)
        return Decision(job.job_id, "wait", None, 0.0, (), f"no free {' or '.join(short)} nodes for a new group",
                        short)
    placement = Placement(None, ids[ROLLOUT], ids["train"], ids[ROLLOUT], ids["train"])
    cost = sum(need[p] * cluster.node_price(p) for p in POOLS)
    cand = Candidate(NEW, None, placement, cost, "chosen", reason)
    return Decision(job.job_id, "new-group", placement, cost, (cand,))


def packable(state: PlanState, job: Job) -> list[Placement]:
    """Direct-packing placements that honour group size and residency (no SLO check).

    One placement per group, on the first residency-feasible node choice; this is what
    the paper's Random and Most-Idle baselines choose among.
    """
    cluster = state.cluster
    need = {p: job.nodes(p, cluster.gpus_per_node) for p in POOLS}
    out: list[Placement] = []
    if job.colocate:  # it shares no group
        return out
    for group in state.groups.values():
        if group.colocated or len(group.members) >= cluster.max_group_size:
            continue
        picks = {}
        for pool in POOLS:
            choices, _ = node_choices(state, group, pool, need[pool], job.mem(pool))
            if not choices:
                break
            picks[pool] = choices[0]
        else:
            out.append(Placement(group.group_id, picks[ROLLOUT], picks["train"]))
    return out


def packed(job: Job, placement: Placement, reason: str) -> Decision:
    cand = Candidate("pack", placement.group_id, placement, 0.0, "chosen", reason)
    return Decision(job.job_id, "packed", placement, 0.0, (cand,))
