"""RollMux: the conservative inter-group planner (``rollmux.planner``).

``rollmux`` takes the first cheapest feasible candidate, as Algorithm 1 of the paper;
``rollmux-bestfit`` evaluates every candidate at the cheapest feasible cost and takes the
one that leaves its group best utilized; ``rollmux-consolidate`` also offers running jobs
a zero-cost move that gives nodes back (``Planner.repack``); ``rollmux-regroup`` in
addition re-solves a group that lost a job together with one other group, exactly, and
moves all their jobs when that lowers the groups' waste rate (``improve.plan_regroup``,
``rollmux.waste``: node cost less the work the jobs get done; under an accounting with
fixed departures, where a job's stay does not depend on its speed, their $/h instead).
``rollmux-full-regroup`` also regroups after an arrival that opens a group and, like
``rollmux-hedge``, offers each job alone a regrouping whenever the head of the waiting
line is refused (``regroup_on_wait``). ``rollmux-lifetime`` and ``rollmux-full-lifetime``
place each arrival by the lifetime objective (``rollmux.lifetime``: the dollars a
placement adds until its group's members have all finished) instead of marginal $/h;
they read the iterations each job has left (``uses_remaining``: the simulator and the
live plane pass ``remaining``).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from rollmux.accounting import OURS, CostAccounting
from rollmux.fit_memo import FitMemo
from rollmux.improve import plan_regroup
from rollmux.lifetime import Remaining
from rollmux.model import Job
from rollmux.plan_state import PlanState
from rollmux.planner import PAPER_SPACE, Decision, Planner, Space


class RollMuxPolicy:
    def __init__(self, tie_break: str = "first", name: str = "rollmux", consolidate: bool = False,
                 regroup: bool = False, accounting: CostAccounting = OURS, space: Space = PAPER_SPACE,
                 objective: str = "rate") -> None:
        self.name = name
        self.planner = Planner(tie_break=tie_break, accounting=accounting, space=space, objective=objective)
        self.uses_remaining = self.planner.objective == "lifetime"
        if consolidate:
            self.repack = self.planner.repack
        if regroup:  # the exact solves check every start where the planner does (not under the paper's accounting)
            # hosting stays out under the paper's accounting, as in the planner
            solver_space = replace(space, all_starts=space.all_starts and accounting.whole_run_slo_checks,
                                   hosting=space.hosting and not accounting.one_node_per_pool)
            objective = "cost" if accounting.fixed_departures else "waste"
            self.regroup = partial(plan_regroup, one_node=accounting.one_node_per_pool, space=solver_space,
                                   objective=objective, memo=FitMemo())  # one memo for all its regroupings
            # with co-location or training scaling, also try to regroup a group that an arrival
            # opened (it may undo a greedy co-location once a partner arrives)
            self.regroup_on_arrival = space.colocation or space.train_scaling
            # with co-location, a job whose cheapest placement is alone on its training nodes
            # holds them: when the waiting line's head is refused, each job alone in its group
            # is offered a regrouping, which gives nodes back (docs/results.md; in the
            # paper's space or with hosting it gained nothing there)
            self.regroup_on_wait = space.colocation

    def place(self, state: PlanState, job: Job, remaining: Remaining | None = None) -> Decision:
        if remaining is None:
            return self.planner.decide(state, job)
        return self.planner.decide(state, job, remaining=remaining)
