"""What a restored control plane must hold before a service runs it.

A state file the service wrote always passes; one damaged by hand, by a tool or by a
disk may decode cleanly and still contradict itself, and a service running it would
grant one node to two groups, serve a job in two groups, or answer 500 to every change
that touches a bad row. ``check_restored(control, snap)`` raises ``StateInconsistent``
naming the first contradiction:

* every ``jobs`` row holds the job its key names, in a live state (waiting, placed),
  with a spec inside its contract (``Job.validate``); every departed record is ended;
* every member of a group is a placed job whose record names that group, in exactly
  one group; every placed job is a member of its group;
* the waiting line lists waiting jobs, each once;
* no node is held by two groups, and no free node by any group or listed twice; on
  two pools, every node a group holds or the inventory lists free is one the saved
  cluster has on that side (a file saved with more nodes than its cluster now lists);
* the counters are integers from 0 to ``MAX_COUNTER`` and the clock a finite number;
* every node listed as added live (``ControlPlane.added_live``) is a node of its pool.

The service turns it into ``StateDamaged`` (nothing runs; the file keeps its rows).
"""
from __future__ import annotations

import math

from rollmux.errors import SpecError

MAX_COUNTER = 2**62  # seq, ord and grants_total: far beyond any run, well inside SQLite's 64-bit integers


class StateInconsistent(ValueError):
    """A restored state whose parts contradict each other (see the module docstring)."""


def check_restored(control, snap: dict) -> None:
    """Raise ``StateInconsistent`` unless ``control`` (restored from ``snap``) holds
    everything the module docstring lists."""
    from rollmux.runtime.control import JOB_STATES, PLACED, WAITING

    jobs = control.jobs
    for key, body in snap["jobs"].items():
        if body["job"]["job_id"] != key:
            raise StateInconsistent(f"jobs row {key!r} holds job {body['job']['job_id']!r}")
        rec = jobs[key]
        if not rec.live:
            raise StateInconsistent(f"job {key!r}: state {rec.state!r} in the live jobs (expected waiting or placed)")
        try:
            rec.job.validate()
        except SpecError as err:
            raise StateInconsistent(f"job {key!r}: {err}") from None
    for rec in jobs.values():
        if rec.state not in JOB_STATES:
            raise StateInconsistent(f"job {rec.job_id!r}: state {rec.state!r} (expected one of {list(JOB_STATES)})")
        if rec.live and rec.job_id not in snap["jobs"]:
            raise StateInconsistent(f"the departed record of job {rec.job_id!r} is {rec.state} (expected an ended one)")
    member_of: dict[str, str] = {}
    held: dict[str, str] = {}
    for gid, g in snap["groups"].items():
        for job_id in g["members"]:
            if job_id in member_of:
                raise StateInconsistent(f"job {job_id!r} is a member of groups {member_of[job_id]!r} and {gid!r}")
            member_of[job_id] = gid
            rec = jobs[job_id]
            if rec.state != PLACED or rec.group_id != gid:
                raise StateInconsistent(f"group {gid!r} lists job {job_id!r}, which is {rec.state} in group "
                                        f"{rec.group_id!r}")
        for node in {*g["rollout_nodes"], *g["train_nodes"]}:
            if held.setdefault(node, gid) != gid:
                raise StateInconsistent(f"node {node!r} is held by groups {held[node]!r} and {gid!r}")
    for rec in jobs.values():
        if rec.state == PLACED and member_of.get(rec.job_id) != rec.group_id:
            raise StateInconsistent(f"job {rec.job_id!r} is placed in group {rec.group_id!r}, which does not list it")
    glob = snap["globals"]
    seen: set[str] = set()
    for job_id in glob["waiting"]:
        rec = jobs.get(job_id)
        if job_id in seen or rec is None or rec.state != WAITING:
            raise StateInconsistent(f"the waiting line lists {job_id!r} "
                                    + ("twice" if job_id in seen else "which is not a waiting job"))
        seen.add(job_id)
    free: set[str] = set()
    for pool, nodes in glob["inventory"]["free"].items():
        for node in nodes:
            if node in held or node in free:
                raise StateInconsistent(f"node {node!r} of pool {pool!r} is listed free "
                                        + (f"and held by group {held[node]!r}" if node in held else "twice"))
            free.add(node)
    if control.fleet is None:
        _check_pools(control.plan, snap["groups"], glob["inventory"]["free"])
    for name in ("seq", "ord", "grants_total"):
        value = glob[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNTER:
            raise StateInconsistent(f"globals.{name}={value!r}: expected an integer from 0 to {MAX_COUNTER}")
    clock = glob["clock"]
    if clock is not None and not (isinstance(clock, (int, float)) and math.isfinite(clock)):
        raise StateInconsistent(f"globals.clock={clock!r}: expected a finite number of seconds")
    for pool, nodes in control.added_live.items():
        for node in nodes:
            if control.plan.pool_of(node) != pool:
                raise StateInconsistent(f"globals.added_live lists {node!r} in the {pool} pool, which does not have "
                                        f"it")


def _check_pools(plan, groups: dict, free: dict) -> None:
    """Every node of ``groups`` (a co-located group's on its training side only) and of
    the ``free`` lists is a node of that side (``PlanState.has_node``)."""
    sides = [(f"group {gid!r}", side, nodes) for gid, g in groups.items()
             for side, nodes in (("rollout", () if g["colocated"] else g["rollout_nodes"]),
                                 ("train", g["train_nodes"]))]
    sides += [("the free list", pool, nodes) for pool, nodes in free.items()]
    for where, side, nodes in sides:
        for node in nodes:
            if not plan.has_node(side, node):
                raise StateInconsistent(f"{where} names node {node!r} of the {side} pool, which the saved "
                                        f"cluster does not have")
