"""Policies on a fleet of GPU types (``rollmux.fleet``), for the simulator.

Each plans on a ``FleetState`` (``new_state``), which the simulator uses in place of a
``PlanState``; a job's phases then take their time on its group's types, and every SLO
is judged against the job's solo time on the reference types.

* ``FleetRollMux``: the fleet planner (each job's view and group), or the same planner
  confined to one view (a fixed-type assignment, ``only``): a job that cannot meet its
  SLO there is rejected. With ``objective="lifetime"`` it places by the dollars a
  placement adds until its group ends (``rollmux.lifetime``; the simulator passes each
  job's remaining iterations). With ``regroup=True`` it also regroups after departures
  (``fleet_exact.plan_fleet_regroup``: two groups of a view re-solved by waste, or a job
  left alone moved to a cheaper view; on a fleet of one view in a space with co-location,
  as on two pools, also for each job alone when the waiting line's head is refused,
  ``regroup_on_wait``). With ``hedge=True`` (``rollmux-hedge``) arrivals keep
  each group dominated by its members' Gavel+ options (``fleet_planner``, "Dominance over
  Gavel+"), and a job alone in its group, after an arrival or a departure, is first
  offered partners alone in other groups, one to three of them
  (``fleet_exact._join_alone``).
* ``FleetAlone``: each job alone on its own nodes, by one of ``fleet_planner.alone_options``:
  a fixed one (solo-d on a view, co-located on a pool: run there even when it misses
  its SLO, as the two-pool baselines do), or with ``gavel=True`` each job's cheapest
  option that meets its SLO (the cheapest overall when none does): Gavel+ over types.
  With bounded pools a job waits for its option's nodes (Gavel+: for the cheapest of
  its options that has them free). An option that needs more nodes of a pool than the
  pool has in all can never run: Gavel+ never takes it (``gavel_ranking``), and a job
  none of whose options can ever run is rejected, naming the pool.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

from rollmux.fit_memo import FitMemo
from rollmux.fleet import Fleet, Profiles, translate
from rollmux.fleet_exact import plan_fleet_regroup
from rollmux.fleet_planner import (FleetPlanner, FleetState, alone_options, alone_short, gavel_ranking, short_sides,
                                   short_text)
from rollmux.lifetime import Remaining
from rollmux.model import ROLLOUT, TRAIN, Job
from rollmux.planner import FULL_SPACE, PAPER_SPACE, Decision, Space
from rollmux.policies.base import colocated_group, isolated


class FleetRollMux:
    def __init__(self, fleet: Fleet, profiles: Profiles, space: Space = PAPER_SPACE, only: tuple[str, ...] = (),
                 name: str = "", sharing_cost: bool | None = None, objective: str = "rate",
                 regroup: bool = False, hedge: bool = False) -> None:
        self.planner = FleetPlanner(fleet, profiles, space=space, sharing_cost=sharing_cost, objective=objective,
                                    hedge=hedge)
        self.uses_remaining = objective == "lifetime"  # the simulator then passes ``remaining`` (rollmux.lifetime)
        if regroup:
            # rollmux-hedge: step 1's solves of at most HEDGE_MAX_JOBS jobs (docs/fleet.md)
            # one memo of group searches for every regrouping of this policy (rollmux.fit_memo)
            self.regroup = partial(plan_fleet_regroup, space=space, value=self.planner.gavel_value,
                                   max_jobs=HEDGE_MAX_JOBS, memo=FitMemo()) if hedge else partial(
                plan_fleet_regroup, space=space, memo=FitMemo())
            # as on two pools with training scaling or co-location, where the fleet has one view;
            # on several views it cost more (docs/fleet.md); with hedge, a job that starts alone
            # is offered a partner at once
            self.regroup_on_arrival = hedge or (
                (space.colocation or space.train_scaling) and len(fleet.views()) == 1)
            # with hedge, jobs alone hold their own nodes: when the waiting line's head is
            # refused, each is offered a gathering, which gives nodes back (docs/results.md);
            # as on two pools with co-location, where the fleet has one view (not measured
            # on several views)
            self.regroup_on_wait = hedge or (space.colocation and len(fleet.views()) == 1)
        self.only = only
        self.name = name or (f"rollmux on {only[0]}" if only else "rollmux")

    def new_state(self) -> FleetState:
        return self.planner.new_state(self.only)

    def place(self, state: FleetState, job: Job, remaining: Remaining | None = None) -> Decision:
        d = self.planner.decide(state, job, remaining=remaining)
        if d.decision is not None and d.decision.placement is not None:
            return d.decision
        short: tuple[str, ...] = ()
        if d.outcome == "wait":  # the sides whose pools lacked nodes in the views that had room otherwise
            sides = {side for v in d.verdicts if v.reason.startswith("inventory") and v.decision is not None
                     and v.decision.placement is not None
                     for side in short_sides(state, state.views[v.view][0], v.decision.placement)}
            short = tuple(side for side in (ROLLOUT, TRAIN) if side in sides)
        return Decision(job.job_id, d.outcome, None, 0.0, (), d.reason, short)


class FleetAlone:
    def __init__(self, fleet: Fleet, profiles: Profiles, name: str, option: str = "", gavel: bool = False) -> None:
        if not gavel and not option:
            raise ValueError("FleetAlone: name an option (e.g. 'solo-d on H20/H800') or set gavel=True")
        self.fleet, self.profiles, self.name, self.option, self.gavel = fleet, profiles, name, option, gavel

    def new_state(self) -> FleetState:
        return FleetState(self.fleet, self.profiles)

    def place(self, state: FleetState, job: Job) -> Decision:
        """The job alone on its option's nodes; Gavel+ takes, among its options that can ever
        run and meet the SLO (all that can ever run if none does), the cheapest whose
        bounded pools have the nodes now, and waits when none has; a fixed option waits for
        its nodes. Rejected when no option of the policy can ever run (``alone_short``)."""
        mine = [o for o in alone_options(self.fleet, self.profiles, job) if self.gavel or o.name == self.option]
        options = gavel_ranking(self.fleet, self.profiles, job) if self.gavel else [
            o for o in mine if not alone_short(self.fleet, o)]
        if not options:
            reason = "; ".join(f"{o.name}: {alone_short(self.fleet, o)}" for o in mine)
            return Decision(job.job_id, "rejected", None, 0.0, (), reason)
        shortest, sides = "", ()
        for pick in options:
            view, sub = state.views[pick.view]
            moved = translate(self.fleet, self.profiles, job, view, strict=False)
            decision = colocated_group(sub, moved) if pick.kind == "co-located" else isolated(sub, moved)
            short = short_text(state, view, decision.placement)
            if not short:
                return decision
            if not shortest:
                shortest, sides = f"{pick.name}: {short}", short_sides(state, view, decision.placement)
        return Decision(job.job_id, "wait", None, 0.0, (), shortest, sides)


#: rollmux-hedge regroups after every arrival that opens a group, so its exact solves are
#: kept to this many jobs: on the first 80 jobs of philly-mix, 228.2 $/h in 20 s against
#: 220.3 $/h in 528 s (under cProfile) with the default (10); on production 561.8 against 560.7 $/h
#: (measured before jobs alone were gathered by more than two; the largest gathering is this size too)
HEDGE_MAX_JOBS = 4


class FleetRollMuxSpec(NamedTuple):
    space: Space
    objective: str = "rate"
    regroup: bool = False
    hedge: bool = False


#: The fleet planner's policies by name
FLEET_ROLLMUX = {"rollmux": FleetRollMuxSpec(PAPER_SPACE), "rollmux-full": FleetRollMuxSpec(FULL_SPACE),
                 "rollmux-lifetime": FleetRollMuxSpec(PAPER_SPACE, "lifetime"),
                 "rollmux-full-lifetime": FleetRollMuxSpec(FULL_SPACE, "lifetime"),
                 "rollmux-regroup": FleetRollMuxSpec(PAPER_SPACE, regroup=True),
                 "rollmux-full-regroup": FleetRollMuxSpec(FULL_SPACE, regroup=True),
                 "rollmux-hedge": FleetRollMuxSpec(FULL_SPACE, regroup=True, hedge=True)}


def fleet_rollmux(fleet: Fleet, profiles: Profiles, name: str) -> FleetRollMux:
    """The fleet planner's policy ``name`` of ``FLEET_ROLLMUX`` (KeyError for another name)."""
    space, objective, regroup, hedge = FLEET_ROLLMUX[name]
    return FleetRollMux(fleet, profiles, space, name=name, objective=objective, regroup=regroup, hedge=hedge)


def rollmux_policies(fleet: Fleet, profiles: Profiles) -> list:
    """The fleet planner's policies (``FLEET_ROLLMUX``), in that order."""
    return [fleet_rollmux(fleet, profiles, name) for name in FLEET_ROLLMUX]


def fleet_policies(fleet: Fleet, profiles: Profiles) -> list:
    """Every policy ``rollmux fleet simulate`` compares, in table order: the fleet planner
    in the paper's placement space (``rollmux``) and in the full one (``rollmux-full``:
    training scaling and co-location too), each also with the lifetime objective
    (``-lifetime``) and with regrouping (``-regroup``), the paper-space planner on each
    view, solo-d on each view, co-located on each pool, Gavel+."""
    views = [v.name for v in fleet.views()]
    sample = alone_options(fleet, profiles, Job("_", 1.0, 1.0))
    return (rollmux_policies(fleet, profiles)
            + [FleetRollMux(fleet, profiles, only=(v,)) for v in views]
            + [FleetAlone(fleet, profiles, o.name, o.name) for o in sample]
            + [FleetAlone(fleet, profiles, "gavel+", gavel=True)])
