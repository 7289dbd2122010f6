"""Perturbed histories of planned groups under the execution rule: an oracle for the SLO check.

The planner accepts a group when every member meets its SLO in the steady state that
the group settles into from each of its 2^n starts (each member ready for rollout or
for training at time 0), for the group and for every group that departures could leave
behind (``rollmux.planner``, "Every start"). A live group reaches states that no start
leads to. Members join one at a time, mid-rotation. Phases run shorter than their worst
case for a while. A member leaves mid-phase (a cancel). Under the same worst-case
durations, such a state can settle into another periodic schedule, one the check never
saw.

``stress_plan`` runs every group of two or more of a plan through perturbed histories on
``GroupExecutor``, the reference rule (``steady_slowdowns``), and returns where each
member settled: its mean iteration over its last ``MEASURED`` iterations, once the
perturbations are over, against its SLO. ``check_planner`` does that for plans of random
jobs (``traces.generate``) made by a planner of the given space. Nothing here is a
proof: a clean report bounds nothing, and a miss is a counterexample.
"""
from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from rollmux.execution import GroupExecutor
from rollmux.intra import MemberProfile, worst_start
from rollmux.model import ROLLOUT, TRAIN, Cluster
from rollmux.plan_state import PlanState
from rollmux.planner import Planner, Space
from rollmux.traces.generate import generate

SETTLE_ITERATIONS = 400  # each member runs this many after the last perturbation ...
MEASURED = 300  # ... and the mean of its last MEASURED is compared with its SLO
SLO_EPS = 1e-6


@dataclass(frozen=True)
class Settled:
    """Where one member settled after one history: ``slowdown`` (mean iteration / solo)
    against its ``slo``; ``analysed`` is the plan's own figure (its worst start)."""

    seed: int
    group_id: str
    job_id: str
    history: int
    slowdown: float
    slo: float
    analysed: float

    @property
    def missed(self) -> bool:
        return self.slowdown > self.slo * (1 + SLO_EPS)


@dataclass(frozen=True)
class HistoryReport:
    """What ``check_planner`` ran and found."""

    groups: int  # groups of two or more members
    histories: int
    misses: tuple[Settled, ...]

    @property
    def groups_missed(self) -> int:
        return len({(m.seed, m.group_id) for m in self.misses})

    @property
    def worst_excess(self) -> float:
        """max slowdown / SLO over the misses (0.0 without any)."""
        return max((m.slowdown / m.slo for m in self.misses), default=0.0)


def steady_slowdowns(profiles: list[MemberProfile], admit_at: list[float], rng: random.Random,
                     noisy_until: float = 0.0, leave: tuple[int, float] | None = None) -> dict[str, float]:
    """Run the rule on one history and return each remaining member's settled slowdown.

    Member i is admitted at ``admit_at[i]`` (non-decreasing: the group's admission
    order). A phase started before ``noisy_until`` takes a uniform 20-100% of its worst
    case, a later one its worst case. Member ``leave[0]`` is removed at the first event
    at or after ``leave[1]`` once it is admitted, wherever it is. After the last of these,
    every remaining member runs ``SETTLE_ITERATIONS`` iterations. Its slowdown is the mean
    of the last ``MEASURED`` (training end to training end) over its solo iteration.
    """
    ex = GroupExecutor()
    index = {p.job_id: i for i, p in enumerate(profiles)}
    settled = max(noisy_until, admit_at[-1], leave[1] if leave else 0.0)
    pending = sorted((t, i) for i, t in enumerate(admit_at))
    running: list[tuple[float, int, str]] = []
    ends: list[list[float]] = [[] for _ in profiles]
    gone: set[int] = set()
    now = 0.0
    while True:
        while pending and pending[0][0] <= now:
            p = profiles[pending.pop(0)[1]]
            ex.admit(p.job_id, p.rollout_nodes, p.train_nodes, now, p.switch_roll, p.switch_train)
        if leave is not None and now >= leave[1] and profiles[leave[0]].job_id in ex.members():
            ex.remove(profiles[leave[0]].job_id)
            running = [r for r in running if r[1] != leave[0]]
            heapq.heapify(running)
            gone.add(leave[0])
            leave = None
        for grant in ex.dispatch(now):
            i = index[grant.job_id]
            worst = profiles[i].t_roll if grant.pool == ROLLOUT else profiles[i].t_train
            scale = rng.uniform(0.2, 1.0) if now < noisy_until else 1.0
            heapq.heappush(running, (now + grant.switch_s + worst * scale, i, grant.pool))
        if all(len(e) > SETTLE_ITERATIONS for i, e in enumerate(ends) if i not in gone):
            break
        if not running and not pending:
            raise RuntimeError("the execution rule stalled with members waiting")
        now = min(([running[0][0]] if running else []) + ([pending[0][0]] if pending else []))
        while running and running[0][0] == now:
            _, i, pool = heapq.heappop(running)
            ex.finish(profiles[i].job_id, now)
            if pool == TRAIN and now > settled:
                ends[i].append(now)
    out = {}
    for i, p in enumerate(profiles):
        if i not in gone:
            last = ends[i][-(MEASURED + 1):]
            out[p.job_id] = (last[-1] - last[0]) / MEASURED / p.t_solo
    return out


def stress_plan(state: PlanState, histories: int = 6, seed: int = 0, noise: bool = True,
                on_group: Callable[[int, int], None] | None = None) -> list[Settled]:
    """Run each group of two or more of ``state`` through ``histories`` histories
    (``group_histories``, one random stream for the whole plan) and return where each
    member settled in each. Deterministic in ``seed``. ``on_group(done, total)`` is
    called after each group (for progress)."""
    rng = random.Random(seed)
    out: list[Settled] = []
    shared = [gid for gid, group in state.groups.items() if len(group.members) > 1]
    for done, gid in enumerate(shared, 1):
        out += group_histories(state, gid, histories, rng, noise, seed)
        if on_group is not None:
            on_group(done, len(shared))
    return out


def group_histories(state: PlanState, group_id: str, histories: int, rng: random.Random, noise: bool = True,
                    seed: int = 0) -> list[Settled]:
    """Where each member of group ``group_id`` settles in ``histories`` histories drawn
    from ``rng``. A history: staggered admissions within 1.5 of the group's longest solo
    iteration, a noisy spell of a random length (none without ``noise``: worst-case phases
    throughout), and (every other history, three members or more) a random member
    leaving at a random time. ``analysed`` is the planner's figure: the worst over every
    start and every order of the members (``intra.worst_start``)."""
    group = state.groups[group_id]
    profiles = [state.profile(m, group.colocated) for m in group.members]
    slo = {m.job.job_id: m.job.slo for m in group.members}
    worst = worst_start(profiles, orders=True)
    analysed = {p.job_id: worst[p.job_id] / p.t_solo for p in profiles}
    span = max(p.t_roll + p.t_train for p in profiles)
    out = []
    for history in range(histories):
        admit_at = sorted([0.0] + [rng.uniform(0, 1.5 * span) for _ in profiles[1:]])
        leave = ((rng.randrange(len(profiles)), rng.uniform(0, 10 * span * len(profiles)))
                 if history % 2 and len(profiles) > 2 else None)
        noisy = rng.uniform(0, 10 * span * len(profiles)) if noise else 0.0
        for job_id, s in steady_slowdowns(profiles, admit_at, rng, noisy, leave).items():
            out.append(Settled(seed, group_id, job_id, history, s, slo[job_id], analysed[job_id]))
    return out


def check_planner(space: Space, mix: str, seeds: range, jobs_per_seed: int = 12,
                  histories: int = 6, noise: bool = True) -> HistoryReport:
    """Plan ``jobs_per_seed`` jobs of ``mix`` per seed with ``Planner(space=space)`` on the
    default cluster, all present at once, and ``stress_plan`` each plan with its seed."""
    groups = runs = 0
    found: list[Settled] = []
    for seed in seeds:
        state = PlanState(Cluster())
        planner = Planner("first", space=space)
        for job in generate(jobs_per_seed, seed, mix=mix):
            decision = planner.decide(state, job)
            if decision.outcome not in ("wait", "rejected"):
                state.apply(job, decision.placement)
        shared = sum(len(g.members) > 1 for g in state.groups.values())
        groups += shared
        runs += shared * histories
        found += [m for m in stress_plan(state, histories, seed, noise) if m.missed]
    return HistoryReport(groups, runs, tuple(found))
