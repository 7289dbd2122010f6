"""Exact co-execution plan for a small set of jobs present at once (the offline optimum).

Problem
-------
Given a cluster and jobs J (all present at once), choose a partition of J into groups
and, for every group G, a rollout node count r_G, a training node count t_G and the
pinning of every member (exactly ``need_p(j) = ceil(gpus_p(j) / gpus_per_node)``
distinct nodes of each pool p inside G), minimising

    Cost = sum_G  r_G * price_R + t_G * price_T          (price_p = price of one node)

subject to, for every group G:

    size:       |G| <= cluster.max_group_size
    residency:  every node n of G:  sum_{k pinned to n} mem_k(pool of n) <= host_mem(pool)
    SLO:        every member k:  iter_k(G) <= SLO_k * T_solo_k * (1 + planner.SLO_EPS)
    training:   t_G = max_{k in G} need_T(k)   (the training side is never scaled)
    apart:      an asynchronous job (staleness >= 1) is alone in its group
                (``planner.ASYNC_APART``); so is a job that only runs co-located
                (``Job.colocate``), which is always co-located (below) in every space

where iter_k(G) is ``intra.analyze`` of the members built exactly as
``PlanState.profile`` builds them (switch seconds from ``cluster.switch_cost``), in
admission order. With ``robust=True`` a group must also keep every SLO after any
departures: every non-empty subset of its members, with their pinning and admission
order, meets the SLO constraint too (the planner's departure check, which makes the
groups it builds hereditarily feasible). These are the planner's steady-state
constraints minus its online gates (saturation, no regrouping, the start-up check of
jobs with a known length), so every plan the planner can reach by placing the same
jobs one at a time lies in the search space of ``robust=True``, and of the default
too when the planner's departure check is off: the planner never beats the optimum.

Admission order. The execution rule breaks same-instant ties by admission order, so
``iter_k(G)`` depends on it. Members are admitted in *arrival order* (``arrival_s``,
then position in the input list), the order in which the planner would admit them.
The optimum is exact for that order only; another order can make a group feasible
that this one rejects (searching all orders would multiply the work by up to |G|!).

Method
------
1. Subset DP. For subsets S in increasing bitmask order,
       best[S] = min over S1 <= S holding S's lowest job of  group[S1] + best[S \\ S1]
   (min-cost set partition, O(3^n) additions). ``split[S]`` is the same minimum with
   S1 != S: the best way to run S as two or more groups.
2. Cheapest group for S, searched only below ``split[S]``: a group for S costing at
   least ``split[S]`` can be replaced by that split in any partition, so pruning it
   loses no optimum. With t = max need_T, the group's cost grows with r alone, so
   r runs from max need_R up to sum need_R and the first r with a feasible pinning
   gives group[S]. A node nobody uses only adds cost, so every node must be used.
3. Pinnings up to symmetry. Members are pinned in admission order; two nodes of a
   pool that hold the same set of earlier members are interchangeable, so a member
   picks how many nodes to take from each such class (the rule of the planner's ``node_choices``).
   This lists every pinning exactly once up to renaming the nodes of each pool, and
   renaming changes nothing the rule sees.
4. Pruning before ``analyze``, both exact necessary conditions:
   * residency, node by node, as members are pinned;
   * rate bound: a member meeting its SLO completes iterations at rate
     rho_k >= 1 / (SLO_k * T_solo_k), and a node runs one phase at a time, so on each
     node n: sum_{k on n} d_k / (SLO_k * T_solo_k) <= 1 (d_k: k's phase on n's pool;
     switch seconds only add work). ``analyze`` measures iter_k = window / iterations
     over a window in which node n is busy at most the window, so the bound holds for
     its numbers too.
   Pinnings that pass are analysed (memoized on shape by ``intra``); the first
   feasible one at the cheapest r is kept. With ``robust=True`` a pinning whose full
   group passes is then checked on each subset of 2 or more members (a single member
   alone never switches, so its slowdown is 1).

Complexity. Subsets: sum_{s <= max_group_size} C(n, s). Pinnings of one subset: at
most the number of set partitions of it per pool for one-node jobs (Bell(5) = 52 for
five members), more for multi-node jobs; each costs one ``analyze``
(O(|G|^2 x iterations)). The split budget usually stops the search at small r. The DP
adds O(3^n).

Beyond the paper (``space``, ``rollmux.planner.Space``)
-------------------------------------------------------
* ``train_scaling``: the training constraint above is dropped; t_G, like r_G, runs
  from max need_T to sum need_T, and step 2 walks the pairs (r, t) in increasing cost.
  Pinnings, bounds and checks are the same on both sides.
* ``colocation``: a one-job group may instead run co-located on need_T(j) training
  nodes (``rollmux.colocation``) when its co-located slowdown s_j <= SLO_j and a node
  holds mem_R + mem_T; it counts s_j * need_T(j) * price_T, the planner's effective
  marginal cost of that option (``rollmux.planner``, "Placement space"), so the objective
  is ``PlanState.effective_cost_per_hour`` (the plain $/h when nothing is co-located).
  ``lower_bound`` then counts only the jobs that cannot be co-located: the others may
  hold no rollout node, and a co-located job may count less than its nodes' price
  (s_j < 1 when the trace gives fast co-located times).
* ``hosting``: a member other than the first (admission order) may be *hosted*: both its
  phases on need_T(j) of the group's training nodes, none on the rollout pool, with the
  co-located phase times (switches inside) and its disaggregated T_solo as SLO basis, as
  ``PlanState.profile`` builds it (``Member.hosted``). Candidates: members that could run
  co-located alone (``hostable_job``). Every set H of them is searched, the empty one
  first, each as in steps 2-4 with three changes: r runs over the others' rollout needs
  only; a hosted member takes only training nodes that a member admitted before it and
  not hosted holds (the planner hosts only on a group's existing nodes, at dC = 0), with
  both phases' memory and the share I_c / (SLO_j * T_solo_j) of each (I_c: its co-located
  iteration alone, ``colocation.iteration_s``); and the guard ``_gang_over_hosted`` (no
  member's training spans a hosted member's nodes and others) is a constraint. The
  planner's hosted placements satisfy all three, so its plans stay in this space.
  ``lower_bound``: a job that may be hosted asks nothing of the rollout pool, and its
  training share is the lesser of t_j and I_c over SLO_j * T_solo_j.
* ``all_starts`` (on in every space unless turned off): a group, and with ``robust=True`` each subset,
  must also meet every SLO from each of its starts (``intra.worst_start``), as the planner
  checks there ("Every start" in ``rollmux.planner``); with ``all_orders`` (also on) from
  each start in every order of its members.
The planner's choices in the same space lie in the search space as before, so the
planner never beats this optimum either.

Objective (``objective``)
-------------------------
* ``"cost"`` (the default): Cost above, the plan's $/h (effective with co-location).
* ``"waste"``: the plan's waste rate (``rollmux.waste``),

      W = sum_G  C_G - sum_{k in G} b_k / iter_k(G)

  with C_G the group's plain $/h and b_k the price of the node time one solo iteration
  of k keeps busy; its integral over time is the part of the bill decisions can change.
  The constraints and the search space are the same. Step 2 changes: a cheaper size
  no longer dominates, since a wider group can slow its members less, so for subset S
  every size (r, t) is searched whose floor is below the best W found, and every
  feasible pinning of it is analysed; the least W is kept. The floor: C - sum_k u_k
  prices each node's idle time, and node n of pool p is busy at most a fraction 1 of the
  time and the members at most busy_p = sum_k need_p(k) * d_p(k) / T_solo_k
  node-equivalents in all (iter_k >= T_solo_k in a disaggregated group), so

      W(r, t) >= price_R * max(0, r - busy_R) + price_T * max(0, t - busy_T).

  With hosting, busy_p counts the members that are not hosted, and a hosted member k
  subtracts at most b_k / I_c (its iteration is at least I_c, below; b_k still prices its
  phases as if disaggregated, so its work cannot be put on one pool's idle time).

  A pinning is checked from every start (``all_starts``) only once its W beats the best,
  the robust subsets last. A co-located one-job group has
  W = need_T * price_T - b_k / iter_colo(k). The budgets of step 2 use
  ``objective_lower_bound``: ``lower_bound`` minus sum_k of k's largest work rate
  (``waste.max_work_rate``), a valid bound on W.

Limits. At most ``max_jobs`` jobs (default 12; ``ExactLimitError`` above). Pools are
treated as unbounded (a bounded pool raises ``ExactLimitError``: inventory couples
the groups and is not modelled). Exact for the arrival admission order and for
groups whose training pool equals the largest training need; durations are the jobs'
worst-case profiles, as everywhere in planning.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import combinations
from typing import Callable, Iterator, Sequence

from rollmux import colocation, waste
from rollmux.errors import RollMuxError
from rollmux.fit_memo import FitMemo
from rollmux.intra import GroupAnalysis, MemberProfile, analyze, worst_start
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Group, Job, Member
from rollmux.plan_state import Placement, PlanState, member_profile
from rollmux.planner import PAPER_SPACE, SLO_EPS, Space, _gang_over_hosted

DEFAULT_MAX_JOBS = 12
OBJECTIVES = ("cost", "waste")  # what ``solve`` minimises (module docstring, "Objective")
_BOUND_SLACK = 1e-6
_COST_TOL = 1e-9


class ExactLimitError(RollMuxError, ValueError):
    """The instance is outside what the exact solver handles (too many jobs, bounded pools)."""


@dataclass(slots=True, frozen=True)
class ExactStats:
    """Work done by one ``solve`` call."""

    jobs: int
    subsets_searched: int   # subsets whose cheapest group was searched (cost below the split)
    subsets_skipped: int    # subsets whose cheapest possible group already cost >= the split
    analyze_calls: int      # groups analysed (pinnings past the bounds, plus subsets when robust)
    seconds: float


@dataclass(slots=True, frozen=True)
class ExactSolution:
    """The optimum: its cost, its groups, and the placements that rebuild it.

    ``placements`` applied in order to a fresh ``PlanState(cluster)`` (see ``to_state``)
    give exactly ``groups``; members of each group appear in admission order.
    """

    cluster: Cluster
    cost_per_hour: float  # the plan's $/h
    objective: float      # what was minimised: ``PlanState.effective_cost_per_hour`` of the plan,
    #                       or ``waste.waste_per_hour`` with objective="waste"
    groups: tuple[Group, ...]
    placements: tuple[tuple[Job, Placement], ...]
    stats: ExactStats

    def to_state(self) -> PlanState:
        state = PlanState(self.cluster)
        for job, placement in self.placements:
            state.apply(job, placement)
        return state


@dataclass(slots=True, frozen=True)
class _Demand:
    """What one member asks of one pool: nodes, memory per node, rate-bound share per node;
    ``after``: a hosted member may take only nodes that one of the first ``after`` members
    (in pinning order) holds."""

    need: int
    mem: float
    share: float
    after: int | None = None


@dataclass(slots=True, frozen=True)
class Fit:
    """Cheapest feasible group for a subset: node counts and local pinnings (node indices)."""

    cost: float  # the objective's value for the group ($/h, effective $/h or waste $/h)
    rollout: int
    train: int
    pins: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # per member: (rollout idx, train idx)
    colocated: bool = False  # one member, both phases on its ``train`` training nodes
    hosted: tuple[int, ...] = ()  # members (positions) hosted on their ``train`` nodes, no rollout node


@dataclass(slots=True)
class SearchCounter:
    searched: int = 0
    skipped: int = 0
    analyze_calls: int = 0


def solve(cluster: Cluster, jobs: Sequence[Job], max_jobs: int = DEFAULT_MAX_JOBS,
          robust: bool = False, budget: float | None = None, space: Space = PAPER_SPACE,
          objective: str = "cost", memo: FitMemo | None = None) -> ExactSolution | None:
    """Minimum-cost plan for ``jobs`` on ``cluster`` (see the module docstring), or the
    plan of least waste rate with ``objective="waste"``; ``memo`` (``rollmux.fit_memo``)
    answers group searches a caller asked before.

    With ``budget``, only plans whose objective is lower are of interest: the result is the
    optimum if it is below ``budget`` (by more than a relative 1e-9, so that rounding in
    sums never passes for a saving) and None otherwise. A group for a subset S is then
    searched only below budget - objective_lower_bound(J minus S), which loses no plan
    under the budget and skips most of the work when there is none.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}: expected one of {OBJECTIVES}")
    start = time.perf_counter()
    cluster.validate(known_gpu=False)  # (a fleet's view may name a GPU type of its own; its jobs come translated)
    if len(jobs) > max_jobs:
        raise ExactLimitError(f"exact solver: {len(jobs)} jobs > max_jobs={max_jobs} "
                              f"(the search grows like 3^n; raise max_jobs to insist)")
    for pool in POOLS:
        if cluster.pool(pool).nodes is not None:
            raise ExactLimitError(f"exact solver: the {pool} pool is bounded ({cluster.pool(pool).nodes} nodes); "
                                  "it plans on unbounded pools only")
    if len({j.job_id for j in jobs}) != len(jobs):
        raise ValueError("exact solver: job ids must be unique")
    for job in jobs:
        job.validate(cluster)
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_s, i))
    ordered = [jobs[i] for i in order]
    n = len(ordered)
    counter = SearchCounter()
    full = (1 << n) - 1
    room = [float("inf")] * (full + 1)  # what a group for mask may cost at most
    if budget is not None:
        for mask in range(1, full + 1):
            rest = [ordered[i] for i in range(n) if not mask >> i & 1]
            room[mask] = budget - objective_lower_bound(cluster, rest, space, objective)

    def fit_of(mask: int, budget_s: float) -> Fit | None:
        members = [ordered[i] for i in range(n) if mask >> i & 1]
        return group_fit(cluster, members, min(budget_s, room[mask]), robust, counter, space, objective=objective,
                         memo=memo)

    best, fits, blocks = partition(ordered, cluster.max_group_size, fit_of)
    if budget is not None and not best < budget - _COST_TOL * max(1.0, abs(budget)):
        return None
    placements = placements_of(cluster, ordered, [(b, fits[b]) for b in blocks])
    state = PlanState(cluster)
    for job, placement in placements:
        state.apply(job, placement)
    stats = ExactStats(n, counter.searched, counter.skipped, counter.analyze_calls,
                       time.perf_counter() - start)
    value = state.effective_cost_per_hour() if objective == "cost" else waste.waste_per_hour(state)
    return ExactSolution(cluster, state.cost_per_hour(), value, tuple(state.groups.values()), tuple(placements), stats)


def partition(ordered: list[Job], max_group_size: int,
              fit_of: Callable[[int, float], Fit | None]) -> tuple[float, dict[int, Fit], list[int]]:
    """Steps 1-2 of the method: the min-cost set partition of ``ordered`` (admission order)
    into groups, ``fit_of(mask, budget)`` giving the cheapest group for a subset (a bit
    mask of positions) if one costs less than ``budget``. Groups hold at most
    ``max_group_size`` jobs; an asynchronous or co-located-only job is alone. Returns the
    optimum's cost, the fits and the chosen blocks, ordered by their first member."""
    n = len(ordered)
    full = (1 << n) - 1
    best = [0.0] + [float("inf")] * full
    choice = [0] * (full + 1)
    fits: dict[int, Fit] = {}
    apart = [j.staleness > 0 or j.colocate for j in ordered]
    for mask in range(1, full + 1):
        low = mask & -mask
        rest = mask ^ low
        split, split_sub = float("inf"), 0
        sub = rest
        while True:  # submasks S1 = low | sub with S1 != mask
            s1 = low | sub
            if s1 != mask and s1 in fits:
                value = fits[s1].cost + best[mask ^ s1]
                if value < split:
                    split, split_sub = value, s1
            if sub == 0:
                break
            sub = (sub - 1) & rest
        best[mask], choice[mask] = split, split_sub
        size = mask.bit_count()
        if size <= max_group_size and (size == 1 or not any(apart[i] for i in range(n) if mask >> i & 1)):
            fit = fit_of(mask, split)
            if fit is not None:
                fits[mask] = fit
                best[mask], choice[mask] = fit.cost, mask
    blocks: list[int] = []
    mask = full if best[full] < float("inf") else 0  # nothing under the budgets: no blocks
    while mask:
        blocks.append(choice[mask])
        mask ^= choice[mask]
    blocks.sort(key=lambda b: (b & -b).bit_length())
    return best[full], fits, blocks


def group_fit(cluster: Cluster, members: list[Job], budget: float, robust: bool, counter: SearchCounter,
              space: Space, colocation: bool = True, objective: str = "cost",
              memo: FitMemo | None = None) -> Fit | None:
    """The best group for ``members`` below ``budget`` in ``space`` by ``objective``: a
    disaggregated one (``_cheapest_group``, looked up in ``memo`` first), or for one job its
    co-located fit when that is better and allowed (co-location in ``space``, and
    ``colocation`` true; a co-located-only job always)."""
    fit = None if members[0].colocate else _cheapest_group(cluster, members, budget, robust, counter,
                                                          space.train_scaling, space.all_starts, objective,
                                                          space.hosting, space.all_orders, memo)
    if len(members) == 1 and colocation and (space.colocation or members[0].colocate):
        fit = _colocated_fit(cluster, members[0], min(budget, fit.cost if fit else float("inf")), objective) or fit
    return fit


def colocatable(cluster: Cluster, job: Job) -> bool:
    """True when ``job`` may run co-located: synchronous, within its SLO, both phases' state fits a node."""
    return (not job.staleness and colocation.slowdown(job, cluster) <= job.slo * (1 + SLO_EPS)
            and colocation.fits(job, cluster))


def hostable_job(cluster: Cluster, job: Job) -> bool:
    """True when ``job`` may be hosted in a shared group (``Space.hosting``): co-locatable, and
    not a co-located-only job (which is always alone)."""
    return not job.colocate and colocatable(cluster, job)


def lower_bound(cluster: Cluster, jobs: Sequence[Job], space: Space = PAPER_SPACE) -> float:
    """A lower bound on the cost of any plan for ``jobs`` (0 for none). Per pool p it needs

        n_p >= max( max_j need_p(j),  ceil(|J| / max_group_size),  ceil(sum_j need_p(j) * s_p(j)) )

    nodes: a group has a node of each pool, and s_p(j) = d_p(j) / (SLO_j * T_solo_j) is j's
    share of a node at its SLO rate (the rate bound of step 4). With co-location in
    ``space`` only the jobs that cannot be co-located count (module docstring). With
    hosting, a job that may be hosted asks nothing of the rollout pool (its ``need`` and
    share there count 0) and its training share is the lesser of its two (hosted, it
    takes I_c / (SLO_j * T_solo_j) of its nodes).
    """
    jobs = [j for j in jobs if not j.colocate and not (space.colocation and colocatable(cluster, j))]
    if not jobs:
        return 0.0
    groups = math.ceil(len(jobs) / cluster.max_group_size)
    hostable = [space.hosting and hostable_job(cluster, j) for j in jobs]
    bound = 0.0
    for pool in POOLS:
        need, shares = [], 0.0
        for j, host in zip(jobs, hostable):
            k = 0 if host and pool == ROLLOUT else j.nodes(pool, cluster.gpus_per_node)
            d = j.t_roll_s if pool == ROLLOUT else j.t_train_s
            if host and pool == TRAIN:
                d = min(d, colocation.iteration_s(j, cluster))
            need.append(k)
            shares += k * d / (j.slo * j.t_solo)
        bound += cluster.node_price(pool) * max(max(need), groups, math.ceil(shares - _BOUND_SLACK))
    return bound


def objective_lower_bound(cluster: Cluster, jobs: Sequence[Job], space: Space = PAPER_SPACE,
                          objective: str = "cost") -> float:
    """A lower bound on ``objective`` for any plan of ``jobs``: ``lower_bound``, less every
    job's largest work rate for the waste rate (module docstring, "Objective")."""
    bound = lower_bound(cluster, jobs, space)
    if objective == "waste":
        bound -= sum(waste.max_work_rate(j, cluster, space.colocation or space.hosting or j.colocate) for j in jobs)
    return bound


def _colocated_fit(cluster: Cluster, job: Job, budget: float, objective: str = "cost") -> Fit | None:
    """``job`` co-located on its own training nodes, if allowed and its objective is below ``budget``."""
    if not colocatable(cluster, job):
        return None
    need = job.nodes(TRAIN, cluster.gpus_per_node)
    if objective == "cost":
        cost = colocation.slowdown(job, cluster) * need * cluster.node_price(TRAIN)
    else:
        work = waste.iteration_value(job, cluster) / colocation.iteration_s(job, cluster)
        cost = need * cluster.node_price(TRAIN) - work
    if cost >= budget - _COST_TOL * max(1.0, abs(budget)):
        return None
    return Fit(cost, 0, need, (((), tuple(range(need))),), colocated=True)


def _cheapest_group(cluster: Cluster, members: list[Job], budget: float, robust: bool,
                    counter: SearchCounter, train_scaling: bool = False, all_starts: bool = False,
                    objective: str = "cost", hosting: bool = False, all_orders: bool = False,
                    memo: FitMemo | None = None) -> Fit | None:
    """The best feasible group for ``members`` (admission order) by ``objective`` below
    ``budget``, or None: the cheapest one, or the one of least waste rate (module docstring,
    "Objective"); with ``train_scaling`` the training side may be wider than the widest
    member; with ``all_starts`` every SLO is checked from every start too (``intra.worst_start``,
    over every order of the members with ``all_orders``);
    with ``hosting`` every set of hostable members after the first is also tried hosted
    (module docstring, "Hosting"), the set without any first. With ``memo``
    (``rollmux.fit_memo``) an answer it knows is returned without a search (counted as
    skipped), and every search's answer is kept there."""
    hostable = [i for i, j in enumerate(members) if i and hosting and hostable_job(cluster, j)]
    limit = budget - _COST_TOL * max(1.0, abs(budget))
    if memo is not None:
        key = memo.key(cluster, members, (robust, train_scaling, all_starts, objective, hosting, all_orders))
        accept = limit if limit == limit else float("inf")  # (an infinite budget gives nan: no bound)
        known, fit = memo.get(key, accept)
        if known:
            counter.skipped += 1
            return fit
    best: Fit | None = None
    searched = False
    for size in range(len(hostable) + 1):
        for hosted in combinations(hostable, size):
            fit, tried = _search_group(cluster, members, frozenset(hosted), limit if best is None else best.cost,
                                       robust, counter, train_scaling, all_starts, objective, all_orders)
            searched = searched or tried
            best = fit or best
    if searched:
        counter.searched += 1
    else:
        counter.skipped += 1
    if memo is not None:
        memo.put(key, accept, best)
    return best


def _search_group(cluster: Cluster, members: list[Job], hosted: frozenset[int], limit: float, robust: bool,
                  counter: SearchCounter, train_scaling: bool, all_starts: bool,
                  objective: str, all_orders: bool) -> tuple[Fit | None, bool]:
    """``_cheapest_group`` for one set of ``hosted`` members (positions; never the first):
    the best group below ``limit`` (None when there is none), and whether any size was
    searched (False when the floor of the smallest already reaches ``limit``)."""
    gpn = cluster.gpus_per_node
    price = {pool: cluster.node_price(pool) for pool in POOLS}
    cap = {pool: cluster.pool(pool).host_mem_gb for pool in POOLS}
    # pinning order: the disaggregated members in admission order, then the hosted ones, each
    # of which may take only nodes of a disaggregated member admitted before it
    order = [i for i in range(len(members)) if i not in hosted] + sorted(hosted)
    before = {i: sum(1 for k in order[:len(members) - len(hosted)] if k < i) for i in hosted}
    colo = {i: colocation.iteration_s(members[i], cluster) for i in hosted}

    def demand_of(pool: str, i: int) -> _Demand:
        j = members[i]
        if i in hosted:  # on the training pool only
            return _Demand(j.nodes(TRAIN, gpn), colocation.node_mem_gb(j), colo[i] / (j.slo * j.t_solo), before[i])
        return _Demand(j.nodes(pool, gpn), j.mem(pool),
                       (j.t_roll_s if pool == ROLLOUT else j.t_train_s) / (j.slo * j.t_solo))

    demand = {pool: [demand_of(pool, i) for i in order if pool == TRAIN or i not in hosted] for pool in POOLS}
    t_min = max(d.need for d in demand[TRAIN])
    t_max = sum(d.need for d in demand[TRAIN] if d.after is None) if train_scaling else t_min
    r_min = max(d.need for d in demand[ROLLOUT])
    r_max = sum(d.need for d in demand[ROLLOUT])
    by_waste = objective == "waste"
    values = [waste.iteration_value(j, cluster) for j in members] if by_waste else []
    # busy node-equivalents per pool of the disaggregated members at solo speed, and the
    # hosted members' work rates at their fastest (module docstring, "Objective"):
    # W >= sum_p price_p * max(0, n_p - busy_p) - hosted_rate
    busy = dict.fromkeys(POOLS, 0.0)
    hosted_rate = 0.0
    if by_waste:
        for i, j in enumerate(members):
            if i in hosted:
                hosted_rate += values[i] / colo[i]
                continue
            for pool in POOLS:
                busy[pool] += j.nodes(pool, gpn) * (j.t_roll_s if pool == ROLLOUT else j.t_train_s) / j.t_solo

    def floor(r: int, t: int) -> float:  # the least objective a group of r + t nodes can have (cost: busy 0)
        return (price[ROLLOUT] * max(0.0, r - busy[ROLLOUT]) + price[TRAIN] * max(0.0, t - busy[TRAIN])
                - hosted_rate)

    if t_min > t_max or floor(r_min, t_min) >= limit:
        return None, False
    profiles_seen: dict[tuple, MemberProfile] = {}  # (member, its rollout and training node indices)

    def profile_of(i: int, roll_nodes: tuple[int, ...], train_nodes: tuple[int, ...]) -> MemberProfile:
        """Member ``i`` pinned to these nodes, as ``member_profile`` builds it (once per pinning of it)."""
        key = (i, roll_nodes, train_nodes)
        if key not in profiles_seen:
            t_nodes = tuple(f"T{x}" for x in train_nodes)
            r_nodes = t_nodes if i in hosted else tuple(f"R{x}" for x in roll_nodes)
            profiles_seen[key] = member_profile(cluster, Member(members[i], r_nodes, t_nodes, i in hosted))
        return profiles_seen[key]

    train_pins: dict[int, list] = {}
    sizes = sorted(((r * price[ROLLOUT] + t * price[TRAIN], t, r) for r in range(r_min, r_max + 1)
                    for t in range(t_min, t_max + 1)))
    best: Fit | None = None
    for cost, t, r in sizes:
        if floor(r, t) >= (limit if best is None else best.cost):
            if not by_waste:
                break  # sizes come in increasing cost
            continue
        if t not in train_pins:
            train_pins[t] = list(_pinnings(demand[TRAIN], t, cap[TRAIN]))
        if not train_pins[t]:
            continue
        for roll_order in _pinnings(demand[ROLLOUT], r, cap[ROLLOUT]):
            for train_order in train_pins[t]:
                roll = dict(zip(order, roll_order))
                train = dict(zip(order, train_order))
                profiles = [profile_of(i, roll.get(i, ()), train[i]) for i in range(len(members))]
                if hosted and _gang_over_hosted(profiles):
                    continue
                a = _meets_slo(profiles, members, counter)  # steady state; every start only if worth keeping
                if a is None:
                    continue
                value = cost
                if by_waste:
                    value -= sum(b / a.iteration_s[j.job_id] for b, j in zip(values, members))
                    if value >= (limit if best is None else best.cost):
                        continue
                if all_starts and not _meets_slo_from_every_start(profiles, members, all_orders):
                    continue
                if robust and not all(
                        _meets_slo([profiles[i] for i in keep], [members[i] for i in keep], counter, all_starts,
                                   all_orders)
                        for size in range(len(members) - 1, 1, -1)
                        for keep in combinations(range(len(members)), size)):
                    continue
                fit = Fit(value, r, t, tuple((roll.get(i, ()), train[i]) for i in range(len(members))),
                          hosted=tuple(sorted(hosted)))
                if not by_waste:
                    return fit, True  # the first feasible pinning at the cheapest size
                best = fit
    return best, True


def _meets_slo(profiles: list[MemberProfile], jobs: list[Job], counter: SearchCounter,
               all_starts: bool = False, all_orders: bool = False) -> GroupAnalysis | None:
    """The group's analysis when every member meets its SLO (from every start with
    ``all_starts``, in every order of the members with ``all_orders`` too), else None."""
    counter.analyze_calls += 1
    a = analyze(profiles)
    if not all(a.slowdown[j.job_id] <= j.slo * (1 + SLO_EPS) for j in jobs):
        return None
    return a if not all_starts or _meets_slo_from_every_start(profiles, jobs, all_orders) else None


def _meets_slo_from_every_start(profiles: list[MemberProfile], jobs: list[Job], orders: bool = False) -> bool:
    """Every member within its SLO from each of the group's starts (``intra.worst_start``,
    over every order of the members with ``orders``; an asynchronous group has none to check)."""
    if any(p.staleness for p in profiles):
        return True
    limit = {p.job_id: j.slo * p.t_solo * (1 + SLO_EPS) for p, j in zip(profiles, jobs)}
    worst = worst_start(profiles, orders, limit)
    return all(worst[k] <= v for k, v in limit.items())


def _pinnings(demand: list[_Demand], k: int, cap: float) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every pinning of the members onto ``k`` nodes of one pool, up to renaming the nodes.

    Each member takes ``need`` distinct nodes; residency (memory <= ``cap``) and the rate
    bound (sum of shares <= 1) hold on every node; every node is used. Members are
    pinned in order; nodes holding the same set of earlier members form a class, and a
    member chooses how many nodes to take from each class (lowest indices first). A
    member with ``after`` set (hosted) takes only nodes held by one of the first ``after``
    members, so it never uses a node first; what a node may take depends only on its
    class, so the classes stay interchangeable.
    """
    sigs: list[tuple[int, ...]] = [()] * k
    mem = [0.0] * k
    load = [0.0] * k
    pins: list[tuple[int, ...]] = []
    remaining = [0] * (len(demand) + 1)
    for i in range(len(demand) - 1, -1, -1):
        remaining[i] = remaining[i + 1] + (demand[i].need if demand[i].after is None else 0)

    def rec(i: int) -> Iterator[tuple[tuple[int, ...], ...]]:
        if sum(1 for s in sigs if not s) > remaining[i]:
            return
        if i == len(demand):
            yield tuple(pins)
            return
        d = demand[i]
        classes: dict[tuple[int, ...], list[int]] = {}
        for node in range(k):
            if (mem[node] + d.mem <= cap and load[node] + d.share <= 1 + _BOUND_SLACK
                    and (d.after is None or (sigs[node] and sigs[node][0] < d.after))):
                classes.setdefault(sigs[node], []).append(node)
        for nodes in _take(list(classes.values()), d.need):
            saved = [(x, sigs[x], mem[x], load[x]) for x in nodes]
            for x in nodes:
                sigs[x] = sigs[x] + (i,)
                mem[x] += d.mem
                load[x] += d.share
            pins.append(nodes)
            yield from rec(i + 1)
            pins.pop()
            for x, s, m, ld in saved:
                sigs[x], mem[x], load[x] = s, m, ld

    yield from rec(0)


def _take(classes: list[list[int]], need: int) -> Iterator[tuple[int, ...]]:
    """Every way to take ``need`` nodes as counts per class (the first ones of each class)."""
    if need == 0:
        yield ()
        return
    if not classes:
        return
    head, tail = classes[0], classes[1:]
    for c in range(min(need, len(head)), -1, -1):
        for rest in _take(tail, need - c):
            yield tuple(head[:c]) + rest


def placements_of(cluster: Cluster, ordered: list[Job], blocks: list[tuple[int, Fit]],
                  prefix: str = "") -> list[tuple[Job, Placement]]:
    """Placements that rebuild the chosen groups in a fresh, unbounded ``PlanState`` (of
    that ``prefix``).

    Local node index x of pool p in a group gets the next global id the state would mint
    (``R<m>``/``T<m>``) when a member first uses it; that member's placement lists it as new.
    """
    minted = {ROLLOUT: 0, TRAIN: 0}
    node_prefix = {ROLLOUT: f"{prefix}R", TRAIN: f"{prefix}T"}
    out: list[tuple[Job, Placement]] = []
    for number, (mask, fit) in enumerate(blocks):
        names: dict[str, dict[int, str]] = {ROLLOUT: {}, TRAIN: {}}
        members = [ordered[i] for i in range(len(ordered)) if mask >> i & 1]
        group_id = None  # the first member opens the group; PlanState names it g<number>
        if fit.colocated:
            ids_t = tuple(f"{node_prefix[TRAIN]}{minted[TRAIN] + x}" for x in range(fit.train))
            minted[TRAIN] += fit.train
            out.append((members[0], Placement.colocated_on(ids_t)))
            continue
        for position, (job, local) in enumerate(zip(members, fit.pins)):
            if position in fit.hosted:  # its nodes were minted by the members admitted before it
                ids_t = tuple(names[TRAIN][x] for x in local[1])
                out.append((job, Placement.hosted_in(group_id, ids_t)))
                continue
            ids: dict[str, tuple[str, ...]] = {}
            new: dict[str, tuple[str, ...]] = {}
            for pool, idx in zip(POOLS, local):
                fresh = []
                for x in idx:
                    if x not in names[pool]:
                        names[pool][x] = f"{node_prefix[pool]}{minted[pool]}"
                        minted[pool] += 1
                        fresh.append(names[pool][x])
                ids[pool] = tuple(names[pool][x] for x in idx)
                new[pool] = tuple(fresh)
            out.append((job, Placement(group_id, ids[ROLLOUT], ids[TRAIN], new[ROLLOUT], new[TRAIN])))
            group_id = f"{prefix}g{number}"
    return out
