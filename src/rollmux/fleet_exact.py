"""Exact plan on a fleet of GPU types for a small set of jobs present at once.

Problem: the objective of ``rollmux.fleet_planner`` over every partition of the jobs
into groups and every choice of a view per group,

    min  sum_G  C_v(G)(G) * s(G) * sigma(G, v(G))

with, inside each group's view, every constraint of ``rollmux.exact`` on the jobs as
translated to that view (``fleet.translate``; a job that cannot meet its SLO on a view
is never placed there). sigma(G, v) = mean over members of T_solo_v / T_solo_ref.

Method: the subset DP of ``rollmux.exact.partition``; the cheapest group of a subset S is
the least over views v of sigma(S, v) times S's cheapest group in v by that view's
$/h (``exact.group_fit``, searched below the budget divided by sigma(S, v), which
loses nothing since sigma does not depend on the pinning), and, for one job in the
view where its training pool offers co-location, its co-located fit. So the optimum is
exact in the same sense as ``exact.solve``: for the arrival admission order and the
planner's steady-state constraints. Every plan ``plan_jobs`` can reach is in the space
(the fleet planner's groups live in one view each and satisfy the same checks), so the
planner never beats it. Limits: unbounded pools only, at most ``max_jobs`` jobs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Callable, Sequence

from rollmux import reservation
from rollmux.exact import (DEFAULT_MAX_JOBS, ExactLimitError, ExactStats, Fit, SearchCounter, group_fit, partition,
                           placements_of)
from rollmux.fit_memo import FitMemo
from rollmux.fleet import Fleet, Profiles, View, speed_factor, translate
from rollmux.fleet_planner import VALUE_TOL, FleetState
from rollmux.improve import Improvement, Regroup, RegroupPlan, keeps_pace, plan_regroup, starts_in_time
from rollmux.model import Job
from rollmux.planner import PAPER_SPACE, Space, members_keep_pace

_COST_TOL = 1e-9


@dataclass(slots=True, frozen=True)
class FleetSolution:
    """The optimum on a fleet: its $/h, its objective and the plan (one ``PlanState`` per view)."""

    cost_per_hour: float
    objective: float
    state: FleetState
    stats: ExactStats


def solve_fleet(fleet: Fleet, jobs: Sequence[Job], profiles: Profiles | None = None, space: Space = PAPER_SPACE,
                robust: bool = False, max_jobs: int = DEFAULT_MAX_JOBS, only: tuple[str, ...] = (),
                memo: FitMemo | None = None) -> FleetSolution:
    """Minimum-objective plan for ``jobs`` on ``fleet`` (module docstring), on every view
    or on those named in ``only``; ``memo`` (``rollmux.fit_memo``) answers group searches a
    caller asked before."""
    start = time.perf_counter()
    found = _fleet_partition(fleet, jobs, profiles or Profiles(), space, robust, max_jobs, only, None, memo)
    state = found.state()
    return FleetSolution(state.cost_per_hour(), found.objective, state, found.stats(start))


def _joint_group(fleet: Fleet, jobs: Sequence[Job], profiles: Profiles, space: Space, only: tuple[str, ...],
                 singles: dict[str, tuple[Fit, str] | None], memo: FitMemo | None) -> FleetState | None:
    """``solve_fleet(..., robust=True)``'s plan when its optimum puts ``jobs`` in one group,
    else None without building a plan. ``singles`` keeps each job's fit alone, by id,
    between the calls of one caller (same jobs, fleet, profiles, space and views)."""
    found = _fleet_partition(fleet, jobs, profiles, space, True, DEFAULT_MAX_JOBS, only, singles, memo)
    return found.state() if len(found.blocks) == 1 else None


@dataclass(slots=True)
class _Partition:
    """``_fleet_partition``'s optimum: its objective, its blocks (masks of ``ordered``), their
    fits and views; ``state`` builds its plan."""

    fleet: Fleet
    profiles: Profiles
    only: tuple[str, ...]
    ordered: list[Job]
    views: list[View]
    moved: dict[str, list[Job | None]]
    objective: float
    fits: dict[int, Fit]
    blocks: list[int]
    chosen: dict[int, str]
    counter: SearchCounter

    def state(self) -> FleetState:
        state = FleetState(self.fleet, self.profiles, self.only)
        by_id = {j.job_id: j for j in self.ordered}
        for view in self.views:
            mine = [b for b in self.blocks if self.chosen[b] == view.name]
            if not mine:
                continue
            translated = [m if m is not None else self.ordered[i] for i, m in enumerate(self.moved[view.name])]
            for job, placement in placements_of(view.cluster, translated, [(b, self.fits[b]) for b in mine],
                                                f"{view.name}:"):
                state.apply(by_id[job.job_id], placement)
        return state

    def stats(self, start: float) -> ExactStats:
        c = self.counter
        return ExactStats(len(self.ordered), c.searched, c.skipped, c.analyze_calls, time.perf_counter() - start)


def check_limits(fleet: Fleet, jobs: Sequence[Job], max_jobs: int = DEFAULT_MAX_JOBS) -> None:
    """Raise ``ExactLimitError`` when ``solve_fleet`` would refuse ``jobs`` on ``fleet``
    for its size or its bounded pools (a caller checks before its own long work)."""
    fleet.validate()
    if len(jobs) > max_jobs:
        raise ExactLimitError(f"exact solver: {len(jobs)} jobs > max_jobs={max_jobs} "
                              f"(the search grows like 3^n; raise max_jobs to insist)")
    bounded = [p.name for p in fleet.pools if p.nodes is not None]
    if bounded:
        raise ExactLimitError(f"exact solver: pools {bounded} are bounded; it plans on unbounded pools only")


def _fleet_partition(fleet: Fleet, jobs: Sequence[Job], profiles: Profiles, space: Space, robust: bool,
                     max_jobs: int, only: tuple[str, ...],
                     singles: dict[str, tuple[Fit, str] | None] | None, memo: FitMemo | None) -> _Partition:
    """The method of the module docstring, up to the chosen blocks (``solve_fleet``);
    with ``singles``, a job's fit alone (searched with no budget) is looked up there by its
    id first and kept there (the caller's promise: an id names the same job every time)."""
    check_limits(fleet, jobs, max_jobs)
    if len({j.job_id for j in jobs}) != len(jobs):
        raise ValueError("exact solver: job ids must be unique")
    ordered = sorted(jobs, key=lambda j: j.arrival_s)  # stable: ties keep the input order
    views = [v for v in fleet.views() if not only or v.name in only]
    colocating = {fleet.colocation_view(p) for p in fleet.pools}
    moved = {v.name: [translate(fleet, profiles, j, v) for j in ordered] for v in views}
    counter = SearchCounter()
    chosen: dict[int, str] = {}  # mask -> view of its cheapest group

    def search(mask: int, budget: float) -> tuple[Fit, str] | None:
        best: tuple[Fit, str] | None = None
        positions = [i for i in range(len(ordered)) if mask >> i & 1]
        originals = [ordered[i] for i in positions]
        for view in views:
            members = [moved[view.name][i] for i in positions]
            if any(m is None for m in members):
                continue
            sigma = statistics.fmean(speed_factor(o, m) for o, m in zip(originals, members))
            room = min(budget, best[0].cost if best else float("inf")) / sigma
            fit = group_fit(view.cluster, members, room, robust, counter, space, view.name in colocating, memo=memo)
            if fit is not None:
                best = Fit(fit.cost * sigma, fit.rollout, fit.train, fit.pins, fit.colocated), view.name
        return best

    def fit_of(mask: int, budget: float) -> Fit | None:
        alone = singles is not None and mask & (mask - 1) == 0 and budget == float("inf")
        key = ordered[mask.bit_length() - 1].job_id if alone else ""
        if alone and key in singles:
            got = singles[key]
            counter.skipped += 1
        else:
            got = search(mask, budget)
            if alone:
                singles[key] = got
        if got is None:
            return None
        chosen[mask] = got[1]
        return got[0]

    objective, fits, blocks = partition(ordered, fleet.max_group_size, fit_of)
    return _Partition(fleet, profiles, only, ordered, views, moved, objective, fits, blocks, chosen, counter)


#: ``improve_fleet``'s default bound on exact solves.
MAX_SOLVES = 200


def improve_fleet(state: FleetState, space: Space = PAPER_SPACE, max_groups: int = 3, max_jobs: int = 6,
                  max_solves: int = MAX_SOLVES, on_solve: Callable[[int, float], None] | None = None) -> Improvement:
    """Regroup a fleet plan in place while some set of up to ``max_groups`` groups (of any
    views) has a cheaper exact plan (``solve_fleet``, robust: every subset keeps its SLOs;
    the start-up check on every new group), like ``rollmux.improve`` on one cluster. Costs
    are the fleet objective E. Sets of two or more groups are tried smallest first, within a
    size largest E first; when none pays and the plan has more than one view, each group
    alone, largest E first (re-solved, it may move to another view or split; the moves of
    larger sets come first, so the result never costs more than theirs alone). At most
    ``max_solves`` solves. On bounded pools the solves are unbounded and a move is kept
    only when its new groups fit the free nodes plus those of the groups it replaces
    (``reservation.fits_views``). The solves share one ``rollmux.fit_memo.FitMemo``: sets of
    groups overlap, and so do their subsets' searches. ``on_solve(solves, E)`` is called
    after every solve (for progress displays)."""
    memo = FitMemo()
    start = state.effective_cost_per_hour()
    solver_fleet = _unbounded(state.fleet)
    tried: set[tuple[str, ...]] = set()
    moves: list[Regroup] = []
    solves = 0
    while True:
        groups = [(name, g) for name, (_, sub) in state.views.items() for g in sub.groups.values()
                  if space.colocation or not g.colocated]
        move = None
        for k in [*range(2, max_groups + 1), *([1] if len(state.views) > 1 else [])]:
            combos = []
            for combo in combinations(groups, k):
                key = tuple(sorted(g.group_id for _, g in combo))  # ids are never reused: a group's members stay
                jobs = [state.originals[m.job.job_id] for _, g in combo for m in g.members]
                if key not in tried and len(jobs) <= max_jobs:
                    combos.append((sum(state.group_effective(name, g) for name, g in combo), key, combo, jobs))
            combos.sort(key=lambda c: -c[0])
            for cost, key, combo, jobs in combos:
                if solves >= max_solves:
                    return Improvement(tuple(moves), start, state.effective_cost_per_hour(), solves, False)
                solves += 1
                tried.add(key)
                solution = solve_fleet(solver_fleet, jobs, state.profiles, space, robust=True, max_jobs=max_jobs,
                                       only=state.only, memo=memo)
                if on_solve is not None:
                    on_solve(solves, state.effective_cost_per_hour())
                placed = [(name, g) for name, (_, sub) in solution.state.views.items() for g in sub.groups.values()]
                if solution.objective < cost - _COST_TOL * max(1.0, cost) and all(
                        starts_in_time(solution.state.views[name][1], g) for name, g in placed) and (
                        reservation.fits_views(state, key, placed)):
                    move = (cost, combo, solution)
                    break
            if move is not None:
                break
        if move is None:
            return Improvement(tuple(moves), start, state.effective_cost_per_hour(), solves, True)
        cost, combo, solution = move
        before = tuple((g.group_id, tuple(m.job.job_id for m in g.members)) for _, g in combo)
        for _, g in combo:
            for m in list(g.members):
                state.release(m.job.job_id)
        after = []
        for name, (_, sub) in solution.state.views.items():
            for g in sub.groups.values():
                gid = state.materialize(name, g)
                for m in g.members:
                    state.originals[m.job.job_id] = solution.state.originals[m.job.job_id]
                    state.job_view[m.job.job_id] = name
                after.append((gid, tuple(m.job.job_id for m in g.members)))
        moves.append(Regroup(before, tuple(after), cost, solution.objective))


def plan_fleet_regroup(state: FleetState, group_id: str, progress: Callable[[str], tuple[int, float] | None],
                       pause_s: Callable[[str], float], space: Space = PAPER_SPACE,
                       value: Callable[[Job], float] | None = None,
                       max_jobs: int = DEFAULT_MAX_JOBS, memo: FitMemo | None = None) -> RegroupPlan | None:
    """An online regrouping on a fleet after a departure from ``group_id`` (the fleet
    simulator's and the live plane's ``rollmux-regroup`` / ``rollmux-full-regroup``), or None.

    0. With ``value`` (``rollmux-hedge``: g_j, the E of job j's Gavel+ option,
       ``FleetPlanner.gavel_value``), when the group holds one job b: ``_join_alone``
       gathers it with one or more other jobs alone, if that pays (below). Then steps 1
       and 2.

    1. Inside the group's view v: ``improve.plan_regroup`` on v's plan with the waste
       objective (the group and one other group of v, re-solved exactly; every check and
       the pace of every moved job as on two pools). Jobs stay in v, so the work they owe,
       sum_j I_j b_j at v's prices and times, is fixed and the waste rate of v's groups is
       the part of v's bill a move changes (``rollmux.waste``).
    2. Else, when the group is left with one job j: j alone on another view's nodes. With
       I_j iterations left, staying costs about I_j C_G iter_G(j) / 3600 $; its fleet
       optimum alone o (``solve_fleet([j])``: least E = C_o s_o sigma_o, which for one job
       is C_o iter_o / T_ref(j), so least C_o iter_o over every view where j meets its SLO,
       co-location included in the full space) costs I_j C_o iter_o / 3600 plus
       C_o pause_j / 3600 for the nodes it holds while j stops. j moves when that is less,
       o is in another view (inside v, step 1 already had the chance) and j keeps pace
       (``planner.members_keep_pace`` with the pause). A later arrival may still join o.

    On bounded pools every step solves on the fleet with its pools unbounded and keeps a
    plan only when its new groups fit the free nodes plus the nodes of the groups it
    empties (``reservation.fits``); the driver holds those nodes for them until they
    open (``reservation.Reservation``). ``RegroupPlan.view`` names the view of the new
    groups. Every solve looks its group searches up in ``memo`` (``rollmux.fit_memo``),
    which a policy keeps across its regroupings: the jobs alone are gathered again at each
    refusal of the waiting line's head.
    """
    view = group_id.split(":", 1)[0]
    sub = state.views[view][1]
    if value is not None and len(sub.groups[group_id].members) == 1:
        plan = _join_alone(state, group_id, progress, pause_s, space, value, max_jobs, memo)
        if plan is not None and _fits(state, plan):
            return plan
    plan = plan_regroup(sub, group_id, progress, pause_s, max_jobs=max_jobs, space=space, objective="waste",
                        memo=memo)
    if plan is not None and _fits(state, replace(plan, view=view)) and (
            reservation.covered_by_free(state, view, plan.groups)
            or keeps_pace(sub, plan.groups, progress, pause_s, joint_pause=True)):
        return replace(plan, view=view)
    group = sub.groups[group_id]
    if len(group.members) != 1:
        return None
    job_id = group.members[0].job.job_id
    now = progress(job_id)
    if now is None:
        return None
    left = now[0]
    alone = solve_fleet(_unbounded(state.fleet), [state.originals[job_id]], state.profiles, space, robust=True,
                        only=state.only, memo=memo)
    served = [(name, vs) for name, vs in alone.state.views.items() if vs[1].groups]
    if len(served) != 1:  # no view meets its SLO alone (a fleet too slow for it): it stays where it is
        return None
    (target, (_, target_sub)), = served
    if target == view:
        return None
    (new,) = target_sub.groups.values()
    cost_new = target_sub.group_cost_per_hour(new.group_id)
    cost_old = sub.group_cost_per_hour(group_id)
    analysis = target_sub.analysis(new.group_id)
    pause = pause_s(job_id)
    stay = left * cost_old * sub.analysis(group_id).iteration_s[job_id]
    move = left * cost_new * analysis.iteration_s[job_id] + cost_new * pause
    if move >= stay * (1 - _COST_TOL) or not members_keep_pace(analysis, new.members, progress, pause):
        return None
    plan = RegroupPlan((group_id,), (new,), cost_old, cost_new, view=target)
    return plan if _fits(state, plan) else None


def _unbounded(fleet: Fleet) -> Fleet:
    """``fleet`` with every pool unbounded, as the exact solver requires (itself when it is)."""
    if all(p.nodes is None for p in fleet.pools):
        return fleet
    return replace(fleet, pools=tuple(replace(p, nodes=None) for p in fleet.pools))


def _fits(state: FleetState, plan: RegroupPlan) -> bool:
    """Whether ``plan``'s new groups fit the fleet's bounded pools (``reservation.fits``)."""
    return reservation.fits(state, plan.view, plan.replaced, plan.groups)


def _join_alone(state: FleetState, group_id: str, progress: Callable[[str], tuple[int, float] | None],
                pause_s: Callable[[str], float], space: Space, value: Callable[[Job], float],
                max_members: int, memo: FitMemo | None) -> RegroupPlan | None:
    """Step 0 of ``plan_fleet_regroup``: job b, alone in ``group_id``, and one or more
    other jobs alone in their groups (any view) into their joint optimum, when that is one
    group of at most ``max_members`` jobs.

    Partners: every job a alone is tried as a pair {a, b}, or, when more than ``_PAIRS``
    jobs are alone, the ``_PAIRS`` whose phases interleave best with b's: the largest
    min(SLO_a T_solo_a, SLO_b T_solo_b) / max(R_a + T_a, R_b + T_b, R_a + R_b, T_a + T_b),
    the slack of the turns two jobs on one rollout and one training node would take
    (``planner._shared_pair_miss``'s bound without switches; ties by id). Jobs of one kind that pair
    badly can still gather well (three 8B_32k jobs on two rollout nodes and one training
    node beat each one co-located, two of them do not), so the ``_PARTNERS`` partners
    whose pair comes closest to dominance (largest V(P) / C_P, V(P) = sum_k g_k T_ref(k)
    / iter_k(P), over pairs that form one group) are also tried in every larger set with
    b, up to ``max_members`` jobs.

    A set's group P (``solve_fleet``, robust) must be one group, dominated
    (``rollmux.fleet_planner``: C_P <= sum_k g_k T_ref(k) / iter_k(P), g = ``value``) and
    keep every member's pace with the pause (``planner.members_keep_pace``). With I_k
    iterations left and iter_k, C_k now, staying costs about (dollars x 3600)

        S = sum_k I_k iter_k C_k.

    In P member k runs t_k = I_k iter_k(P) seconds. P is paid until every member but
    the last, s, has finished, t = the second largest t_k, and during the pause (the
    longest of the members'); then s has I'_s = I_s - t / iter_s(P) iterations left,
    alone in P or moved to its Gavel+ option with another pause (step 2; the cheaper of
    the two, an estimate that pays P whole while it empties):

        M = C_P (t + pause) + min(C_P I'_s T_P(s), g_s (I'_s T_ref(s) + pause)).

    The set with the largest S - M > 0 moves; None when no set pays.
    """
    view = group_id.split(":", 1)[0]
    b = state.views[view][1].groups[group_id].members[0].job.job_id
    if progress(b) is None:
        return None
    alone: dict[str, str] = {}  # job -> its group, every other job alone that reports progress
    for gid, other in state.groups.items():
        if gid != group_id and len(other.members) == 1 and progress(other.members[0].job.job_id) is not None:
            alone[other.members[0].job.job_id] = gid
    best: tuple[float, RegroupPlan] | None = None
    near: list[tuple[float, str]] = []  # (V(P) / C_P of the pair, partner)
    singles: dict[str, tuple[Fit, str] | None] = {}  # each job's fit alone, found once for every set
    if len(alone) > _PAIRS:
        keep = set(sorted(alone, key=lambda a: (-_pair_slack(state.originals[a], state.originals[b]), a))[:_PAIRS])
        alone = {a: gid for a, gid in alone.items() if a in keep}
    for a in alone:
        got = _alone_set(state, (a, b), {a: alone[a], b: group_id}, progress, pause_s, space, value, singles, memo)
        if got is None:
            continue
        ratio, gain, plan = got
        near.append((ratio, a))
        if plan is not None and (best is None or gain > best[0]):
            best = (gain, plan)
    partners = [a for _, a in sorted(near, reverse=True)[:_PARTNERS]]
    for size in range(2, max_members):
        for chosen in combinations(partners, size):
            ids = (*chosen, b)
            got = _alone_set(state, ids, {**{a: alone[a] for a in chosen}, b: group_id}, progress, pause_s, space,
                             value, singles, memo)
            if got is not None and got[2] is not None and (best is None or got[1] > best[0]):
                best = (got[1], got[2])
    return best[1] if best is not None else None


#: partners of ``_join_alone`` tried in sets of three or more (their pairs nearest dominance)
_PARTNERS = 4
#: jobs alone that ``_join_alone`` tries as pairs at most. On production and philly-mix no
#: more are ever alone at once (the bills are the same without it), and on three
#: 300-job synthetic traces with arrivals 20-50x denser it changed no bill; at 500 running
#: jobs it cut a regrouping from 96 to 57-59 ms (docs/benchmarks.md)
_PAIRS = 16


def _pair_slack(a: Job, b: Job) -> float:
    """``_join_alone``'s order of partners: how far two jobs taking turns on one rollout and
    one training node stay within their SLOs (above 1: room left; switches left out)."""
    period = max(a.t_roll_s + a.t_train_s, b.t_roll_s + b.t_train_s, a.t_roll_s + b.t_roll_s,
                 a.t_train_s + b.t_train_s)
    return min(a.slo * a.t_solo, b.slo * b.t_solo) / period


def _alone_set(state: FleetState, ids: tuple[str, ...], groups: dict[str, str],
               progress: Callable[[str], tuple[int, float] | None], pause_s: Callable[[str], float],
               space: Space, value: Callable[[Job], float],
               singles: dict[str, tuple[Fit, str] | None],
               memo: FitMemo | None) -> tuple[float, float, RegroupPlan | None] | None:
    """``_join_alone``'s test of one set of jobs alone (``groups``: each one's group now):
    None when their joint optimum is not one group, else (V(P) / C_P, the gain S - M,
    the move or None when P is not dominated, a member loses pace or the move does not
    pay)."""
    jobs = {k: state.originals[k] for k in ids}
    plan = _joint_group(_unbounded(state.fleet), list(jobs.values()), state.profiles, space, state.only, singles,
                        memo)
    if plan is None:
        return None
    (target, new), = [(name, g) for name, (_, sub) in plan.views.items() for g in sub.groups.values()]
    target_sub = plan.views[target][1]
    analysis = target_sub.analysis(new.group_id)
    cost_new = target_sub.group_cost_per_hour(new.group_id)
    it = analysis.iteration_s
    worth = sum(value(j) * j.t_solo / it[k] for k, j in jobs.items())
    ratio = worth / cost_new
    if cost_new > worth * (1 + VALUE_TOL):
        return ratio, 0.0, None
    pause = max(pause_s(k) for k in ids)
    if not members_keep_pace(analysis, new.members, progress, pause):
        return ratio, 0.0, None
    left = {k: progress(k)[0] for k in ids}
    stay = sum(left[k] * state.analysis(groups[k]).iteration_s[k] * state.group_cost_per_hour(groups[k]) for k in ids)
    ends = sorted((left[k] * it[k], k) for k in ids)
    t, s = ends[-2][0], ends[-1][1]  # P is paid whole until every member but s has finished
    rest_left = left[s] - t / it[s]
    alone = next(m.job for m in new.members if m.job.job_id == s).t_solo  # its solo iteration in P's view
    rest = min(rest_left * alone * cost_new, value(jobs[s]) * (rest_left * jobs[s].t_solo + pause))
    move = cost_new * (t + pause) + rest
    if move >= stay * (1 - _COST_TOL):
        return ratio, stay - move, None
    cost_old = sum(state.group_cost_per_hour(groups[k]) for k in ids)
    return ratio, stay - move, RegroupPlan(tuple(groups[k] for k in ids), (new,), cost_old, cost_new, view=target)
