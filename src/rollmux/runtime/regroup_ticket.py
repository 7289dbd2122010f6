"""Regroupings decided off the service's lock: a ticket, its decisions, and their check.

A regrouping decision (``improve.plan_regroup``, ``fleet_exact.plan_fleet_regroup``) is
exact solves of a few jobs: milliseconds to a second. Made under the service's one lock,
every other change waits for it. With ``ControlPlane(decide_apart=True)`` (what ``rollmux
serve`` runs by default) the plane only records each regrouping it is asked for, and the
service takes them in three steps:

1. under the lock, ``ControlPlane.regroup_ticket``: a ``RegroupTicket`` with the asks,
   a deep copy of the plan and, for every job in it, what the decision reads of the
   jobs (``_movable``: iterations left and spare seconds, or None when it may not move;
   the migration pause of its model size), all as of now, and the drained nodes;
2. off the lock, in a worker thread, ``RegroupTicket.decide``: the policy's regrouping
   for each ask in order on the copy, exactly as the plane decides one under the lock
   (a job a decision moves may not move in a later one; the nodes its new groups take
   are held on the copy, ``Reservation.start``), each result a ``Decided``;
3. under the lock, ``ControlPlane.apply_regroups``: each decision whose check still
   holds on the live plan is carried out as one decided under the lock would be; a
   stale one is dropped and asked again (at most ``MAX_TRIES`` times in all).

The check (``still_holds``), which makes a decision safe to carry out whatever changed
meanwhile: every group it replaces is still there as it was (``fingerprint``: members,
nodes and pins), every job it moves may still move, its new groups fit the bounded
pools' free nodes plus the replaced groups' (drained nodes left out), and every moved job
still keeps its pace with its current iterations left and spare seconds (the checks of
``improve.keeps_pace``, with the joint pause when the free nodes alone do not cover the
new groups). What it does not re-check is whether it is still the *best* regrouping:
another group that appeared meanwhile might have made a better partner, as it would
have had it arrived a moment later. The replaced groups being unchanged, the cost and
waste rates the decision compared are unchanged too.
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Callable

from rollmux.improve import RegroupPlan, keeps_pace, shape
from rollmux.model import Group
from rollmux.reservation import Reservation, covered_by_free, fits
from rollmux.runtime.logs import LOGGER

log = logging.getLogger(LOGGER)

#: how many times a regrouping ask is decided before a stale decision is dropped for good
#: (the next departure or refusal of the waiting line asks again)
MAX_TRIES = 3


def fingerprint(group: Group) -> tuple:
    """What a decision read of a group it replaces: its shape (``improve.shape``), its
    members in admission order and its nodes on each side."""
    return (shape(group), tuple(m.job.job_id for m in group.members), tuple(group.rollout_nodes),
            tuple(group.train_nodes))


@dataclass(frozen=True, slots=True)
class Decided:
    """One ask's regrouping, decided on a ticket's copy: the ask's group, the plan, and
    the fingerprint of each group it replaces as the copy had it."""

    group_id: str
    plan: RegroupPlan
    seen: tuple[tuple[str, tuple], ...]


@dataclass(frozen=True, slots=True)
class RegroupTicket:
    """The asks of one round and what deciding them reads (module docstring, step 1).

    ``owner``: the ``ControlPlane`` it was taken from (another one, after the service
    reloaded its state, applies nothing of it); ``asks``: ``[group_id, job_id, at,
    tries]`` entries, the first ``len(asks)`` of the plane's; ``plan``: a deep copy of the
    plan; ``progress``: job -> (iterations left, spare seconds) or None; ``migration``:
    job -> the seconds a move of it is planned with; ``regroup``: the policy's decision
    function."""

    owner: object
    asks: tuple[tuple, ...]
    plan: object
    progress: dict[str, tuple[int, float] | None]
    migration: dict[str, float]
    drained: frozenset[str]
    regroup: Callable

    @classmethod
    def take(cls, owner, asks, plan, progress, migration, drained, regroup, shared=()) -> "RegroupTicket":
        """A ticket with a deep copy of ``plan``; the objects in ``shared`` (the fleet,
        its profiles, the cluster: never changed in place) are not copied."""
        memo = {id(o): o for o in shared}
        return cls(owner, tuple(tuple(a) for a in asks), copy.deepcopy(plan, memo), progress, migration,
                   frozenset(drained), regroup)

    def decide(self) -> list[Decided]:
        """Step 2 of the module docstring: each ask whose group is still there, whichever of
        its members asked. A policy that fails to decide (a bug) is logged as
        ``regroup_failed`` and that ask gets no regrouping, as under the lock."""
        plan, chosen = self.plan, set()

        def progress(k: str) -> tuple[int, float] | None:
            return None if k in chosen else self.progress.get(k)

        def pause(k: str) -> float:
            return plan.analysis(plan.job_group[k]).iteration_s[k] + self.migration[k]

        out: list[Decided] = []
        for gid, *_ in self.asks:
            if gid not in plan.groups:  # (group ids are never used again: the ask's group, whoever left it)
                continue
            try:
                decided = self.regroup(plan, gid, progress, pause)
            except Exception:  # noqa: BLE001 - logged with the traceback, as ControlPlane._plan_regroup does
                log.exception("regroup_failed", extra={"group_id": gid,
                                                       "jobs": [m.job.job_id for m in plan.groups[gid].members]})
                continue
            if decided is None or (self.drained and not fits(plan, decided.view, decided.replaced, decided.groups,
                                                             self.drained)):
                continue
            out.append(Decided(gid, decided, tuple((g, fingerprint(plan.groups[g])) for g in decided.replaced)))
            chosen.update(m.job.job_id for g in decided.groups for m in g.members)
            Reservation.start(plan, decided.view, decided.replaced, decided.groups)
        return out


def still_holds(state, decided: Decided, progress: Callable[[str], tuple[int, float] | None],
                pause_s: Callable[[str], float], drained=frozenset()) -> bool:
    """Whether ``decided`` may be carried out on ``state`` (the live plan) now; ``progress``
    and ``pause_s`` as the plane gives them to its policy (module docstring, the check)."""
    plan = decided.plan
    for gid, seen in decided.seen:
        group = state.groups.get(gid)
        if group is None or fingerprint(group) != seen:
            return False
    if any(progress(m.job.job_id) is None for g in plan.groups for m in g.members):
        return False
    if not fits(state, plan.view, plan.replaced, plan.groups, drained):
        return False
    view_state = state.views[plan.view][1] if plan.view else state
    joint = not covered_by_free(state, plan.view, plan.groups)
    return keeps_pace(view_state, plan.groups, progress, pause_s, joint)
