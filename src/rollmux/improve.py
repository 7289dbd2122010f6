"""Plan improvement by regrouping: re-solve the jobs of a few groups exactly (beyond the paper).

Problem
-------
Given a plan whose groups satisfy the planner's constraints, find a cheaper plan for the
same jobs. Algorithm 1 places jobs one at a time and never revisits a choice, so an
early job can end up in a group that later arrivals would have filled better. When the
jobs are all known (``rollmux plan``) or may be moved, a large-neighbourhood search
closes most of that gap:

* neighbourhood: a set K of k groups (k = 2 .. ``max_groups``) holding at most
  ``max_jobs`` jobs in all;
* move: replace K by the exact optimum for its jobs, ``rollmux.exact.solve(robust=True)``
  (size, residency, SLO of every member and of every subset of members: the planner's
  departure check), when that optimum costs less than K and every member also passes
  the planner's start-up check for jobs of known length;
* order: k ascending, then the largest possible saving first (cost(K) minus the lower
  bound below; ties in creation order); the first improving move is applied and the
  scan starts again at k = 2. A set of groups once solved is not solved again (group
  ids are never reused).

It stops at a local optimum (no set of up to ``max_groups`` groups can be regrouped
more cheaply), after ``max_solves`` exact solves, or once ``max_seconds`` have passed
(checked before each solve: one solve under way finishes; in the full space one over
ten jobs can take tens of seconds). Each move strictly lowers the cost, so it
terminates.

Pruning (exact): ``exact.lower_bound`` bounds the cost of any plan of the jobs of K from
the nodes each pool needs (node needs, group count, shares of a node at SLO rates); if
it is not below cost(K), K is skipped, and the solve itself runs with cost(K) as its
budget, so it searches only for plans cheaper than K.

Limits. Groups keep their admission order by arrival (that of the exact solver);
co-located groups are left alone unless the space has co-location, groups that host a
member (``Member.hosted``) unless it has hosting, and groups with a member whose SLO is
below 1 always (``_in_space``). The exact solver plans with one host-memory size per
pool, so a pool listing nodes of different memories is not improved
(``Improvement.skipped`` says so); in a bounded pool a move must also fit the nodes K
frees plus the free ones.

Online (``plan_regroup``, the simulator's ``rollmux-regroup``): the same move for a
group that just lost a job and one other group, while their jobs run, with each moved
job's whole-run SLO checked against the pause the move costs it; ``materialize`` opens
a solver group on fresh nodes. A group the solution re-creates as it is (same jobs, same
nodes up to their names) stays where it is, online and offline: its jobs do not pause
(``left_in_place``). Online, when jobs stay until their work is done, the
move may instead have to lower the groups' waste rate (``objective="waste"``,
``rollmux.waste``): with K's waste W(K) and ``exact.objective_lower_bound`` in place of
cost(K) and ``lower_bound`` above, and the exact solves minimising waste.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Callable

from rollmux import colocation, reservation, waste
from rollmux.errors import PlacementError
from rollmux.exact import ExactSolution, objective_lower_bound, solve
from rollmux.fit_memo import FitMemo
from rollmux.intra import analyze
from rollmux.model import POOLS, Cluster, Group, Job
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import PAPER_SPACE, Space, _startup_miss, members_keep_pace

DEFAULT_MAX_GROUPS = 3
DEFAULT_MAX_JOBS = 10
DEFAULT_MAX_SOLVES = 5000
_COST_TOL = 1e-9


@dataclass(slots=True, frozen=True)
class Regroup:
    """One accepted move: the groups replaced and the groups that replaced them, with the
    $/h of each side, their nodes at their pools' prices, in any space (a move in a space
    with co-location is chosen on effective costs, yet reports $/h): the plan's $/h moves
    by the sum of the moves' differences."""

    before: tuple[tuple[str, tuple[str, ...]], ...]  # (group id, job ids)
    after: tuple[tuple[str, tuple[str, ...]], ...]
    cost_before: float  # $/h of the groups replaced
    cost_after: float  # $/h of the groups that replaced them

    def describe(self) -> str:
        def side(groups: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
            return " + ".join(f"{gid}{{{','.join(jobs)}}}" for gid, jobs in groups)
        return (f"{side(self.before)} -> {side(self.after)}: "
                f"${self.cost_before:.2f}/h -> ${self.cost_after:.2f}/h")

    def to_dict(self) -> dict:
        return {"before": {g: list(j) for g, j in self.before}, "after": {g: list(j) for g, j in self.after},
                "cost_before": round(self.cost_before, 4), "cost_after": round(self.cost_after, 4)}


@dataclass(slots=True, frozen=True)
class Improvement:
    """What ``improve`` did: the moves applied, the cost before and after, the work done."""

    moves: tuple[Regroup, ...]
    cost_before: float
    cost_after: float
    solves: int
    local_optimum: bool  # False when a limit stopped the search
    skipped: str = ""    # why nothing was tried, if so
    limit: str = ""      # what stopped it short of a local optimum: "solves", "seconds" or "interrupted"


def improve(state: PlanState, max_groups: int = DEFAULT_MAX_GROUPS, max_jobs: int = DEFAULT_MAX_JOBS,
            max_solves: int = DEFAULT_MAX_SOLVES,
            on_solve: Callable[[int, float], None] | None = None, space: Space = PAPER_SPACE,
            max_seconds: float | None = None, clock: Callable[[], float] = time.monotonic,
            stop: Callable[[], bool] | None = None) -> Improvement:
    """Regroup ``state`` in place until no set of up to ``max_groups`` groups gets cheaper,
    or until ``max_solves`` exact solves, ``max_seconds`` of ``clock`` (None: no bound) or
    ``stop()`` answering True (a Ctrl-C seen) stop it; the bounds and ``stop`` are checked
    before each solve, never inside one or a regrouping (``Improvement.limit`` names which;
    the plan so far is kept either way).

    Every group the search writes satisfies everything a planner decision guarantees
    (size, residency, SLO of all members and of every subset, start-up); jobs keep
    their ids and requirements, only their group and nodes change. ``on_solve`` is
    called after every exact solve with the solves so far and the plan's cost (for
    progress displays). ``space`` is the placement space of the exact solves
    (``rollmux.planner.Space``); with co-location in it, co-located groups take part and
    costs are ``PlanState.effective_cost_per_hour``'s (reported costs stay $/h). The solves
    share one ``rollmux.fit_memo.FitMemo``: sets of groups overlap, and so do their subsets'
    searches.
    """
    if max_groups < 2:
        raise ValueError(f"max_groups={max_groups}: expected >= 2")
    start = state.cost_per_hour()
    skipped = _unsupported(state.cluster)
    if skipped:
        return Improvement((), start, start, 0, True, skipped)
    solver_cluster = _solver_cluster(state.cluster)
    began = clock()
    memo = FitMemo()
    tried: set[tuple[str, ...]] = set()
    moves: list[Regroup] = []
    solves = 0
    while True:
        move = None
        groups = [g for g in state.groups.values() if _in_space(g, space)]
        for k in range(2, max_groups + 1):
            combos = (c for c in combinations(groups, k) if tuple(g.group_id for g in c) not in tried)
            for combo, jobs, cost in _ranked(state, combos, max_jobs, space):
                limit = ("solves" if solves >= max_solves else
                         "seconds" if max_seconds is not None and clock() - began >= max_seconds else
                         "interrupted" if stop is not None and stop() else "")
                if limit:
                    return Improvement(tuple(moves), start, state.cost_per_hour(), solves, False, limit=limit)
                solves += 1
                tried.add(tuple(g.group_id for g in combo))
                solution = solve(solver_cluster, jobs, max_jobs=max_jobs, robust=True, budget=cost, space=space,
                                 memo=memo)
                if on_solve is not None:
                    on_solve(solves, state.cost_per_hour())
                if solution is not None and _fits(state, combo, solution):
                    move = (combo, solution)
                    break
            if move is not None:
                break
        if move is None:
            return Improvement(tuple(moves), start, state.cost_per_hour(), solves, True)
        moves.append(_apply(state, *move))


def _ranked(state: PlanState, combos, max_jobs: int, space: Space = PAPER_SPACE,
            objective: str = "cost") -> list[tuple[tuple[Group, ...], list[Job], float]]:
    """The sets of groups, with their jobs (arrival order) and their value of ``objective``
    (effective $/h, or waste $/h), whose lower bound leaves room for a gain; largest
    possible gain first, ties in the given order."""
    out = []
    values: dict[str, float] = {}  # group id -> its objective (a group is in many combos)
    for combo in combos:
        jobs = sorted((m.job for g in combo for m in g.members), key=lambda j: j.arrival_s)
        if len(jobs) > max_jobs:
            continue
        for g in combo:
            if g.group_id not in values:
                values[g.group_id] = (colocation.effective_cost(g, state.cluster) if objective == "cost"
                                      else waste.group_waste(state, g.group_id))
        value = sum(values[g.group_id] for g in combo)
        gap = value - objective_lower_bound(state.cluster, jobs, space, objective)
        if gap > _COST_TOL * max(1.0, abs(value)):
            out.append((gap, combo, jobs, value))
    out.sort(key=lambda c: -c[0])
    return [c[1:] for c in out]


def _in_space(group: Group, space: Space) -> bool:
    """Whether the exact solves of ``space`` may re-solve ``group``: a co-located group only
    with co-location in it, a group that hosts a member only with hosting, and none with
    a member whose SLO is below 1. On a fleet a job placed on a view where it misses its
    deadline even alone, disaggregated, has such an SLO (``fleet.translate`` with
    ``strict=False``: Gavel+'s co-located option may still meet it); the exact solver
    refuses such a job, so its group stays as it is."""
    return ((space.colocation or not group.colocated) and (space.hosting or not group.hosts)
            and all(m.job.slo >= 1.0 for m in group.members))


def _unsupported(cluster: Cluster) -> str:
    for pool in POOLS:
        spec = cluster.pool(pool)
        if len({n.host_mem_gb for n in spec.node_list} | ({spec.host_mem_gb} if spec.node_list else set())) > 1:
            return f"the {pool} pool lists nodes with different host memory; the exact solver assumes one size"
    return ""


def _fits(state: PlanState, combo: tuple[Group, ...], solution: ExactSolution) -> bool:
    """The start-up check on every new group, and the inventory of bounded pools."""
    return (all(starts_in_time(state, g) for g in solution.groups)
            and reservation.fits(state, "", tuple(g.group_id for g in combo), solution.groups))


def starts_in_time(state: PlanState, group: Group) -> bool:
    """The planner's start-up check on a solver group: no member with a known length
    waits for its first turn past its SLO (``rollmux.planner``)."""
    a = analyze([state.profile(m, group.colocated) for m in group.members])
    return not _startup_miss(a, [m.job for m in group.members])


def _apply(state: PlanState, combo: tuple[Group, ...], solution: ExactSolution) -> Regroup:
    """Release the jobs of ``combo`` and pin them as the solution's groups say (a group the
    solution re-creates as it is stays in place, ``left_in_place``)."""
    moved, groups = left_in_place(combo, solution.groups)
    before = tuple((g.group_id, tuple(m.job.job_id for m in g.members)) for g in moved)
    cost_before = sum(state.group_cost_per_hour(g.group_id) for g in moved)
    for g in moved:
        for m in list(g.members):
            state.release(m.job.job_id)
    after = tuple((materialize(state, g), tuple(m.job.job_id for m in g.members)) for g in groups)
    return Regroup(before, after, cost_before, sum(state.group_cost_per_hour(gid) for gid, _ in after))


def materialize(state: PlanState, group: Group) -> str:
    """Open ``group`` (a solver group, its node names local to it) on fresh nodes of ``state``
    and pin its members there in their admission order; returns the new group id."""
    names: dict[str, str] = {}
    for pool in POOLS:
        mem = max(colocation.node_mem_gb(m.job) if group.colocated else m.mem_on(pool) for m in group.members)
        fresh = state.peek_new(pool, len(group.nodes(pool)), mem)
        if fresh is None:
            raise PlacementError(f"the {pool} pool has no {len(group.nodes(pool))} free nodes for a regrouped group")
        names.update(zip(group.nodes(pool), fresh))
    if group.colocated:  # one member; its rollout runs on its training nodes
        ids = tuple(names[n] for n in group.train_nodes)
        return state.apply(group.members[0].job, Placement.colocated_on(ids))
    gid = None
    for i, m in enumerate(group.members):
        roll = tuple(names[n] for n in m.rollout_nodes)
        train = tuple(names[n] for n in m.train_nodes)
        if m.hosted:  # never first: its nodes are the group's already
            gid = state.apply(m.job, Placement.hosted_in(gid, train))
            continue
        new_r = tuple(names[n] for n in group.rollout_nodes) if i == 0 else ()
        new_t = tuple(names[n] for n in group.train_nodes) if i == 0 else ()
        gid = state.apply(m.job, Placement(gid, roll, train, new_r, new_t))
    return gid


def group_order(gid: str) -> tuple[int, str]:
    """Groups in creation order (``g<n>``; on a fleet ``<view>:g<n>``, then by view)."""
    view, _, number = gid.rpartition("g")
    return int(number), view


def lone_groups(state) -> list[str]:
    """The ids of the groups of ``state`` (a ``PlanState`` or ``FleetState``) that hold one
    job, in creation order: what a policy with ``regroup_on_wait`` is asked to regroup
    when the head of the waiting line is refused (the simulator and the live plane alike)."""
    return sorted((gid for gid, group in state.groups.items() if len(group.members) == 1), key=group_order)


def open_regrouped(state, group: Group, view: str, originals: dict[str, Job]) -> str:
    """Open a regrouping's solver group: ``materialize`` on a ``PlanState``, or on a fleet
    (``view`` set: ``RegroupPlan.view``) ``FleetState.materialize`` with the members'
    untranslated jobs ``originals`` (job id -> job). Returns the new group id."""
    return state.materialize(view, group, originals) if view else materialize(state, group)


@dataclass(slots=True, frozen=True)
class RegroupPlan:
    """An online regrouping: every job of the ``replaced`` groups moves into ``groups``
    (solver groups, node names local to each; ``materialize`` opens one)."""

    replaced: tuple[str, ...]
    groups: tuple[Group, ...]
    cost_before: float  # $/h of the replaced groups (effective with co-location) ...
    cost_after: float   # ... and of the new ones
    waste_before: float | None = None  # their waste rates ($/h, ``rollmux.waste``), when that was the objective
    waste_after: float | None = None
    view: str = ""  # on a fleet, the view the new groups open in (``FleetState.materialize``)

    @property
    def gain(self) -> float:
        """How much the objective falls ($/h of cost, or of waste)."""
        if self.waste_before is not None and self.waste_after is not None:
            return self.waste_before - self.waste_after
        return self.cost_before - self.cost_after


def plan_regroup(state: PlanState, group_id: str, progress: Callable[[str], tuple[int, float] | None],
                 pause_s: Callable[[str], float], max_solves: int = 8,
                 max_jobs: int = DEFAULT_MAX_JOBS, one_node: bool = False,
                 space: Space = PAPER_SPACE, objective: str = "cost",
                 joint_pause: bool | None = None, memo: FitMemo | None = None) -> RegroupPlan | None:
    """Regroup ``group_id`` with one other group while jobs run (the simulator's
    ``rollmux-regroup``). Pairs are solved exactly, largest possible saving first, at most
    ``max_solves`` of them; the result is the one saving most among those whose groups
    pass everything ``improve`` asks and keep every moved job within its SLO over its
    whole run, or None.

    ``progress(k)`` is job k's (remaining iterations, spare seconds within its SLO), or
    None if k cannot move now; ``pause_s(k)`` bounds the seconds k is stopped by the move
    (until the last member of its new group reaches an iteration boundary, plus the
    migration). A new group opens once all its members have stopped and admits them
    together, so its admission order is the solver's. The check per moved job k in new
    group N:  remaining_k x iter_k(N) + TRANSIENT_PERIODS x period(N) + max_{m in N} pause_s(m)
    <= spare_k (``planner.TRANSIENT_PERIODS``: time for the new group to settle).
    On a bounded pool the new groups must fit its free nodes plus the nodes of the two
    groups (``reservation.fits``), which the driver holds for them until they open
    (``reservation.Reservation``). When the free nodes alone do not cover them, a new
    group may wait for nodes that another new group's members still hold, so the pause
    in its check is the largest over every moved job, not only over its own members
    (``joint_pause``; by default exactly when a pool is bounded and its free nodes do not
    cover the solution).
    ``one_node`` (``--accounting paper``'s ``one_node_per_pool``): the solver sees every job
    on one node per pool, as the planner placed it. ``space``: the placement space of the
    solves (``rollmux.planner.Space``); with co-location in it, co-located groups take part
    and may be opened (a job's phase times follow the kind of group it is in), and costs
    are effective ones (``colocation.effective_cost``). ``objective``: what a move must
    lower, the groups' $/h ("cost") or their waste rate ("waste", ``rollmux.waste``: the
    part of the bill that decisions change when jobs stay until their work is done, so a
    cheaper plan that slows its members more than it saves is refused). ``memo``
    (``rollmux.fit_memo``): the solves' group searches, kept by the policy across calls.
    """
    if _unsupported(state.cluster):
        return None
    bounded = any(state.bounded(p) for p in POOLS)
    group = state.groups[group_id]
    if not _in_space(group, space) or any(progress(m.job.job_id) is None for m in group.members):
        return None
    others = [h for h in state.groups.values() if h is not group and _in_space(h, space)
              and all(progress(m.job.job_id) is not None for m in h.members)]
    ranked = _ranked(state, ((group, h) for h in sorted(others, key=lambda h: h.group_id)), max_jobs, space,
                     objective)
    best: RegroupPlan | None = None
    for pair, jobs, value in ranked[:max_solves]:
        if one_node:
            gpn = state.cluster.gpus_per_node
            jobs = [replace(j, rollout_gpus=min(j.rollout_gpus, gpn), train_gpus=min(j.train_gpus, gpn)) for j in jobs]
        floor = 0.0 if best is None else best.gain
        solution = solve(_solver_cluster(state.cluster), jobs, max_jobs=max_jobs, robust=True, budget=value - floor,
                         space=space, objective=objective, memo=memo)
        if solution is None:
            continue
        moved, groups = left_in_place(pair, solution.groups)
        if not groups:
            continue
        joint = (bounded and not reservation.covered_by_free(state, "", groups)
                 if joint_pause is None else joint_pause)
        ids = tuple(g.group_id for g in moved)
        if (all(starts_in_time(state, g) for g in groups) and reservation.fits(state, "", ids, groups)
                and keeps_pace(state, groups, progress, pause_s, joint)):
            # what stays in place is the same on both sides of the move: it leaves the gain as it is
            stays = [g for g in pair if g.group_id not in ids]
            if objective == "cost":
                kept = sum(colocation.effective_cost(g, state.cluster) for g in stays)
                best = RegroupPlan(ids, groups, value - kept, solution.objective - kept)
            else:
                kept = sum(waste.group_waste(state, g.group_id) for g in stays)
                kept_cost = sum(state.group_cost_per_hour(g.group_id) for g in stays)
                best = RegroupPlan(ids, groups, sum(state.group_cost_per_hour(g) for g in ids),
                                   solution.cost_per_hour - kept_cost, value - kept, solution.objective - kept)
    return best


def left_in_place(replaced: tuple[Group, ...],
                  groups: tuple[Group, ...]) -> tuple[tuple[Group, ...], tuple[Group, ...]]:
    """Split a regrouping of ``replaced`` into ``groups`` (solver groups) into what moves:
    a group of ``replaced`` that some solver group re-creates as it is (``shape``) stays in
    place, its jobs not paused; returns (the groups that empty, the groups that open), in
    their given orders. A shape names its jobs, so it matches at most one group."""
    old, new = {shape(g): g for g in replaced}, {shape(g): g for g in groups}
    kept = old.keys() & new.keys()
    return tuple(g for s, g in old.items() if s not in kept), tuple(g for s, g in new.items() if s not in kept)


def shape(group: Group) -> tuple:
    """``group`` up to its node names and its members' admission order: co-located or not,
    its hosted members, and on each pool the set of members pinned to each node. Two
    groups of one shape cost the same; the one in place already passed the planner's
    checks, whatever its admission order."""
    return (group.colocated, frozenset(m.job.job_id for m in group.members if m.hosted),
            tuple(tuple(sorted(tuple(sorted(m.job.job_id for m in group.members if node in m.nodes(pool)))
                               for node in group.nodes(pool)))
                  for pool in POOLS))


def keeps_pace(state: PlanState, groups, progress: Callable[[str], tuple[int, float] | None],
               pause_s: Callable[[str], float], joint_pause: bool = False) -> bool:
    """``members_keep_pace`` for every new group of a regrouping (solver groups, analysed
    in ``state``), with the pause of its own members, or with ``joint_pause`` of every
    moved job (``plan_regroup``)."""
    every = max(pause_s(m.job.job_id) for g in groups for m in g.members) if joint_pause else 0.0
    return all(members_keep_pace(analyze([state.profile(m, g.colocated) for m in g.members]), g.members, progress,
                                 every or max(pause_s(m.job.job_id) for m in g.members))
               for g in groups)


def _solver_cluster(cluster: Cluster) -> Cluster:
    """The cluster with both pools unbounded, as the exact solver requires."""
    return replace(cluster, rollout=replace(cluster.rollout, nodes=None, node_list=()),
                   train=replace(cluster.train, nodes=None, node_list=()))
