"""The lifetime objective: choose a placement by the dollars it adds until its group ends.

Problem
-------
The planner's own rule (``rollmux.planner``, Algorithm 1) ranks feasible placements by
marginal $/h, C(G') - C(G): joining a group costs nothing when it adds no node, however
much it slows the members down and however long the newcomer stays after they have
left. Under our accounting a job leaves when its work is done, so both are paid: a
slower member holds the group's nodes longer, and the last member holds them alone.

Objective
---------
Let r_k be the iterations member k still has to run and iter_k(G) its analysed
iteration time in group G (``intra.analyze``). If nobody joins or leaves early, G's
nodes are held until its last member ends,

    T(G) = max over k in G of  r_k * iter_k(G)          (seconds)

at G's rate C(G) ($/h). Placing job j as p turns G into G' = G + j, and the plan then
spends

    L(p) = C(G') * T(G') - C(G) * T(G)                  ($, with C(G) T(G) = 0 for a new group)

more to run every member of G' to its end: the added nodes for the group's whole
remaining life, plus the members' slowdown, plus any stretch of time during which j
outlives the others. A co-located new group has T = r_j * I_c, its co-located
iteration; a hosted member is analysed as hosted. The composition is held fixed (members
that leave early speed the rest up, arrivals may fill the group later), so L is an
estimate of the cost to finish, not a bound.

``choose`` takes, among the candidates the planner found feasible (every SLO,
residency, departure and start-up check unchanged), the one with the least L; ties go
to the planner's own order. It needs every r_k: a group with a member of unknown length
(an open-ended live job) gets L = infinity and is chosen only if nothing else is
feasible, and an arriving job of unknown length is placed by the planner's own rule.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from rollmux.intra import analyze
from rollmux.model import ROLLOUT, TRAIN, Job, Member
from rollmux.plan_state import Placement, PlanState

#: iterations a job has left, by job id (None: unknown)
Remaining = Callable[[str], "int | None"]


def lifetime_cost(state: PlanState, job: Job, placement: Placement, r_job: int, remaining: Remaining) -> float:
    """L(p) of the module docstring, in dollars (infinity when a member's length is unknown)."""
    cluster = state.cluster
    added = (len(placement.new_rollout) * cluster.node_price(ROLLOUT)
             + len(placement.new_train) * cluster.node_price(TRAIN))
    if placement.group_id is None:
        member = Member(job, placement.rollout_nodes, placement.train_nodes)
        iteration = analyze([state.profile(member, colocated=placement.colocated)]).iteration_s[job.job_id]
        return added * r_job * iteration / 3600.0
    group = state.groups[placement.group_id]
    left = {m.job.job_id: remaining(m.job.job_id) for m in group.members}
    if any(r is None for r in left.values()):
        return float("inf")
    before = state.analysis(group.group_id).iteration_s
    newcomer = state.profile(Member(job, placement.rollout_nodes, placement.train_nodes, placement.colocated))
    after = analyze([*state.view(group.group_id).profiles, newcomer]).iteration_s
    held = max(left[k] * before[k] for k in left)
    left[job.job_id] = r_job
    held_after = max(left[k] * after[k] for k in left)
    rate = group.cost_per_hour(cluster)
    return ((rate + added) * held_after - rate * held) / 3600.0


def choose(state: PlanState, job: Job, candidates: tuple, remaining: Remaining) -> tuple[tuple, int] | None:
    """The candidates with the feasible one of least L (module docstring) marked
    "chosen" and each feasible one's reason carrying its L, and that one's index; None
    when the job's own length is unknown or nothing is feasible (the planner's own
    choice stands)."""
    r_job = remaining(job.job_id)
    if r_job is None:
        return None
    best: tuple[float, int] | None = None
    cands = list(candidates)
    for i, c in enumerate(cands):
        if c.verdict in ("feasible", "chosen") and c.placement is not None:
            cost = lifetime_cost(state, job, c.placement, r_job, remaining)
            cands[i] = replace(c, verdict="feasible", reason=f"{c.reason + '; ' if c.reason else ''}lifetime ${cost:,.0f}")
            if best is None or cost < best[0]:
                best = (cost, i)
    if best is None:
        return None
    cands[best[1]] = replace(cands[best[1]], verdict="chosen")
    return tuple(cands), best[1]
