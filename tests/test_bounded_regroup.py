"""Regrouping on bounded pools (``rollmux.reservation``): a regrouping counts only the
free nodes and the nodes of the groups it empties, holds them until its new groups open,
and no arrival joins a group it is emptying; the inventory is never exceeded, no job is
lost, and where the pools never bind the run is the unbounded run."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.improve import lone_groups
from rollmux.model import Cluster, Job, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import Planner
from rollmux.policies import make_policy
from rollmux.reservation import Reservation, fits, group_need
from rollmux.runtime.control import ControlPlane
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace
from rollmux.traces.generate import generate
from test_simulator import overlaps

REGROUPING = ["rollmux-regroup", "rollmux-hedge"]


def bounded(rollout: int, train: int) -> Cluster:
    base = Cluster()
    return replace(base, rollout=replace(base.rollout, nodes=rollout), train=replace(base.train, nodes=train))


def queueing(seed: int, nodes: int = 4) -> tuple[list[Job], Cluster]:
    """14 generated jobs with set iteration counts on ``nodes`` + ``nodes`` nodes, no
    switch cost: a trace where jobs queue (the live-against-simulator replays and the
    wait trigger's test)."""
    jobs = generate(14, seed=seed, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    return jobs, replace(bounded(nodes, nodes), switch_cost=SwitchCost("fixed", 0.0, 0.0))


def production(n: int, cluster: Cluster) -> list[Job]:
    return load_trace("production", cluster)[0][:n]


def run_checked(jobs: list[Job], cluster: Cluster, name: str):
    """Simulate, checking the inventory at every plan change."""
    limits = {"rollout": cluster.rollout.nodes, "train": cluster.train.nodes}
    gpn = cluster.gpus_per_node
    seen = []

    def watch(now, state):
        for side, limit in limits.items():
            assert state.gpus_in_use(side) <= limit * gpn, (now, side)
        seen.append(now)

    r = simulate([replace(j) for j in jobs], cluster, make_policy(name, cluster=cluster), record_spans=True,
                 on_change=watch)
    assert seen
    return r


@pytest.mark.parametrize("name", REGROUPING)
def test_roomy_bounded_pools_regroup_exactly_as_unbounded_ones(name):
    """Pools larger than the run ever needs: every regrouping is covered by free nodes
    at its decision, so the run is the unbounded one: the same regroupings and bill."""
    jobs = production(60, Cluster())
    free = simulate([replace(j) for j in jobs], Cluster(), make_policy(name, cluster=Cluster()))
    roomy = bounded(200, 200)
    held = run_checked(jobs, roomy, name)
    assert free.outcomes["regroupings"] > 0
    assert held.outcomes["regroupings"] == free.outcomes["regroupings"]
    assert held.total_cost == pytest.approx(free.total_cost, rel=1e-9)


@pytest.mark.parametrize("name", REGROUPING)
def test_tight_pools_regroup_within_the_inventory_and_lose_no_job(name):
    """12 H20 and 10 H800 nodes for the first 40 production jobs: jobs queue, regroupings
    still happen, the inventory holds at every change, no node runs two phases at once,
    only the pools' own nodes are used and every job runs to its end."""
    cluster = bounded(12, 10)
    jobs = production(40, cluster)
    r = run_checked(jobs, cluster, name)
    assert r.outcomes["regroupings"] > 0 and r.outcomes["regrouped"] > 0
    assert len(r.jobs) == len(jobs) and not r.rejected and all(o.iterations > 0 for o in r.jobs)
    assert any(o.placed_s > o.arrival_s for o in r.jobs)  # the pools bound ...
    assert r.limiting_pool is not None  # ... and the waits are charged to them (fleet-backed policies too)
    assert overlaps(r.spans) == 0
    assert r.peak_gpus["rollout"] <= 12 * 8 and r.peak_gpus["train"] <= 10 * 8


@pytest.mark.parametrize("name", REGROUPING)
def test_regrouping_on_a_fixed_cluster_saves_against_not_regrouping(name):
    """24 H20 and 20 H800 nodes, the first 100 production jobs (every SLO met either way):
    regrouping on the bounded pools costs less than the same run with regrouping off."""
    cluster = bounded(24, 20)
    jobs = production(100, cluster)
    on = run_checked(jobs, cluster, name)
    policy = make_policy(name, cluster=cluster)
    policy.regroup = None  # the same policy, never regrouping
    off = simulate([replace(j) for j in jobs], cluster, policy)
    assert on.outcomes["regroupings"] > 0 and not off.outcomes.get("regroupings")
    assert on.slo_attainment == 1.0
    assert on.total_cost < off.total_cost


@settings(max_examples=16, deadline=None)
@given(seed=st.integers(0, 10_000), rollout=st.integers(3, 8), train=st.integers(3, 8),
       name=st.sampled_from([*REGROUPING, "rollmux-full-regroup", "rollmux-host-regroup"]))
def test_any_small_bounded_run_keeps_its_inventory(seed, rollout, train, name):
    cluster = bounded(rollout, train)
    jobs = [j for j in generate(25, seed=seed) if j.rollout_gpus <= 8 * rollout and j.train_gpus <= 8 * train]
    r = run_checked(jobs, cluster, name)
    assert len(r.jobs) + len(r.rejected) == len(jobs)
    assert overlaps(r.spans) == 0


def _refusals(name: str, seed: int, on_wait: bool | None, backfill: bool = True):
    """Policy ``name`` on ``queueing(seed)``, as made (``on_wait`` None) or with its
    ``regroup_on_wait`` set to ``on_wait``, the waiting line backfilled or strictly first
    come, first placed; what the policy is asked for, in order: ("wait", job) for a refused
    placement, ("placed", job) for another one, ("lone", groups) when the simulator looks
    for the groups of one job (its wait trigger, ``improve.lone_groups``), ("regroup",
    group, plan) for a regrouping; and the run (its spans recorded)."""
    import rollmux.sim.engine as engine

    jobs, cluster = queueing(seed)
    policy = make_policy(name, cluster=cluster)
    if on_wait is not None:
        policy.regroup_on_wait = on_wait
    place, regroup, asked = policy.place, policy.regroup, []

    def placed(state, job, *rest):
        d = place(state, job, *rest)
        asked.append(("wait" if d.outcome == "wait" else "placed", job.job_id))
        return d

    def regrouped(state, gid, *rest):
        plan = regroup(state, gid, *rest)
        asked.append(("regroup", gid, plan))
        return plan

    def looked(state):
        gids = lone_groups(state)
        asked.append(("lone", gids))
        return gids

    policy.place, policy.regroup = placed, regrouped
    engine.lone_groups = looked
    try:
        r = simulate([replace(j) for j in jobs], cluster, policy, migration_s=300.0, record_spans=True,
                     backfill=backfill)
    finally:
        engine.lone_groups = lone_groups
    assert len(r.jobs) == len(jobs) and not r.rejected
    return asked, r


def _gathered_at_refusals(asked) -> int:
    """How many regroupings asked for by the wait trigger were carried out, checking that
    the trigger follows a refused placement and is followed at once by exactly one
    request per group of one job, in creation order."""
    gathered = 0
    for i, a in enumerate(asked):
        if a[0] == "lone":
            assert asked[i - 1][0] == "wait"
            after = asked[i + 1:i + 1 + len(a[1])]
            assert [x[:2] for x in after] == [("regroup", gid) for gid in a[1]]
            gathered += sum(x[2] is not None for x in after)
    return gathered


#: the policies shipped with ``regroup_on_wait`` (jobs alone may sit co-located on
#: training nodes), each with a ``queueing`` seed whose run regroups at refusals
TRIGGERED = [("rollmux-hedge", 42), ("rollmux-full-regroup", 17)]


def test_only_the_policies_whose_jobs_sit_alone_have_the_trigger():
    for name in ("rollmux-hedge", "rollmux-full-regroup"):
        assert make_policy(name, cluster=bounded(4, 4)).regroup_on_wait, name
    for name in ("rollmux-regroup", "rollmux-host-regroup"):  # measured without gain (docs/results.md)
        assert not getattr(make_policy(name, cluster=bounded(4, 4)), "regroup_on_wait", False), name


@pytest.mark.parametrize("name,seed", TRIGGERED)
def test_a_refused_head_offers_each_job_alone_a_regrouping(name, seed):
    """Each time the waiting line's head is refused, the policy is asked to regroup every
    group of one job, in creation order, before anything else happens (strictly first
    come, first placed, every refusal is the head's; backfilled, the trigger still follows
    only refusals); some of those regroupings are carried out, so the run regroups more
    than the same policy without ``regroup_on_wait``, for which the simulator never looks
    for the groups of one job. Under ``rollmux-hedge`` its jobs also wait less."""
    asked, on = _refusals(name, seed, None, backfill=False)  # as shipped
    waits = [i for i, a in enumerate(asked) if a[0] == "wait"]
    assert len(waits) >= 5 and all(asked[i + 1][0] == "lone" for i in waits)
    assert _gathered_at_refusals(asked) >= 2
    asked_off, off = _refusals(name, seed, False, backfill=False)
    assert sum(a[0] == "wait" for a in asked_off) >= 5 and not any(a[0] == "lone" for a in asked_off)
    assert on.outcomes["regroupings"] > off.outcomes["regroupings"]
    if name == "rollmux-hedge":
        assert sum(o.wait_s for o in on.jobs) < sum(o.wait_s for o in off.jobs)
    backfilled, _ = _refusals(name, seed, None)
    assert _gathered_at_refusals(backfilled) >= 1


# --- the reservation and the planner -----------------------------------------------

def test_reservation_holds_free_then_released_nodes_and_hands_them_over():
    """Two groups of 1 + 1 nodes on pools of 4 + 4, regrouped into one group of 4 + 4: the
    two free nodes are held at once, each emptied group's node as its job stops; the
    group is covered only then, and its nodes go back to the free list as it opens."""
    from rollmux.model import Group, Member

    state = PlanState(bounded(4, 4))
    planner = Planner()
    jobs = [Job("a", 100.0, 100.0, slo=1.0, arrival_s=0.0), Job("b", 100.0, 100.0, slo=1.0, arrival_s=1.0)]
    for j in jobs:
        state.apply(j, planner.decide(state, j).placement)
    assert state.free_count("rollout") == 2 and state.free_count("train") == 2
    new = Group("x", ["r0", "r1", "r2", "r3"], ["t0", "t1", "t2", "t3"],
                [Member(jobs[0], ("r0", "r1"), ("t0", "t1")), Member(jobs[1], ("r2", "r3"), ("t2", "t3"))])
    replaced = tuple(state.groups)
    need = group_need(state, "", new)
    assert need == {"rollout": 4, "train": 4}
    assert fits(state, "", replaced, [new])
    assert not fits(state, "", replaced[:1], [new])  # one emptied group leaves a node short
    drained = state.groups[replaced[0]].rollout_nodes[0]
    assert not fits(state, "", replaced, [new], excluded={drained})  # a drained node does not come back
    res = Reservation.start(state, "", replaced, [new])
    assert res.want == {"rollout": 2, "train": 2} and res.waits_for_releases
    assert state.closing == set(replaced)  # no arrival joins them while it waits for their nodes
    assert state.free_count("rollout") == 0 and not res.covers(state, need)
    res.take_released(state, state.release("a").released_nodes)
    assert res.want == {"rollout": 1, "train": 1} and not res.covers(state, need)
    res.take_released(state, state.release("b").released_nodes)
    assert not res.waits_for_releases and res.covers(state, need)
    assert state.free_count("rollout") == 0  # held, not free: no arrival takes them
    assert Reservation.from_dict(res.to_dict()) == res
    res.hand_over(state, need)
    assert state.free_count("rollout") == 4 and state.free_count("train") == 4
    assert res.held == {"rollout": [], "train": []}
    assert res.group_done(state)  # its only group opened: nothing left to hold
    assert state.free_count("rollout") == 4 and not state.closing


def test_no_arrival_joins_a_group_a_regrouping_is_emptying():
    """A group marked closing is never packed into: the newcomer opens its own group."""
    jobs = [Job("a", 100.0, 100.0, slo=2.0, arrival_s=0.0), Job("b", 100.0, 100.0, slo=2.0, arrival_s=1.0)]
    for explain in (False, True):
        state = PlanState(Cluster())
        state.apply(jobs[0], Planner().decide(state, jobs[0]).placement)
        (gid,) = state.groups
        assert Planner().decide(state, jobs[1], explain=explain).placement.group_id == gid
        state.close_group(gid)
        d = Planner().decide(state, jobs[1], explain=explain)
        assert d.placement.group_id is None
        state.release("a")
        assert gid not in state.closing  # forgotten once the group is gone


# --- live: the control plane queues and regroups on bounded pools as the simulator ------

@pytest.mark.parametrize("seed,nodes,every,reconcile", [(0, 4, 0, False), (15, 5, 0, False), (0, 4, 3, False),
                                                        (14, 5, 5, False), (0, 4, 1, True), (15, 5, 2, True)])
def test_live_regrouping_on_bounded_pools_is_the_simulators(seed, nodes, every, reconcile, monkeypatch):
    """A bounded cluster tight enough that jobs queue and regroupings count on the nodes
    they empty, driven in virtual time (restored from its persisted form every ``every``
    steps, and with ``reconcile`` reconciled with its own cluster file too, as a restarted
    ``rollmux serve --cluster`` is): the live plane makes every phase and every move exactly as the simulator
    (the parity oracle of test_live_moves, on bounded pools), every job runs each of its
    iterations once, and the plane ends with no group, no regrouping, no hold and every
    node free."""
    from test_live_moves import _live_replay, _sim_record

    jobs, cluster = queueing(seed, nodes)
    sim_phases, sim_moves, outcomes = _sim_record(jobs, cluster, 300.0, "rollmux-regroup")
    assert outcomes["regrouped"] >= 1 and outcomes["backfilled"] >= 1  # jobs also pass the line
    started = []
    start = Reservation.start.__func__

    def counted(cls, *args):
        got = start(cls, *args)
        started.append(got is not None and got.waits_for_releases)
        return got

    monkeypatch.setattr(Reservation, "start", classmethod(counted))
    out: dict = {}
    live_phases, live_moves = _live_replay(jobs, cluster, 300.0, "rollmux-regroup", restore_every=every, out=out,
                                           reconcile=reconcile)
    assert any(started), "the trace must exercise a regrouping that waits for released nodes"
    assert sorted((j, f, t) for j, f, t, _ in live_moves) == sorted(sim_moves)
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)
    plane = out["plane"]
    assert plane.holds == {} and plane.regroups == {}
    assert plane.plan.free_count("rollout") == nodes and plane.plan.free_count("train") == nodes


def test_a_node_held_for_a_regrouping_cannot_leave_the_cluster_file():
    """``reconcile`` while a regrouping holds nodes on a bounded pool: removing a held node
    is a ``ClusterConflict`` that changes nothing (the regrouping counts on it)."""
    from rollmux.model import NodeSpec
    from rollmux.runtime.control import ClusterConflict
    from test_live_moves import _live_replay

    jobs, cluster = queueing(0, 4)
    tried = []

    def remove_a_held_node(cp, now):
        held = sorted((pool, n) for h in cp.holds.values() for pool, ns in h.held.items() for n in ns)
        if tried or not held:
            return
        pool, node = held[0]
        copy = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), policy="rollmux-regroup",
                                    migration_s=300.0)
        before = json.dumps(copy.snapshot(), sort_keys=True)
        spec = cluster.pool(pool)
        nodes = [NodeSpec(f"{'R' if pool == 'rollout' else 'T'}{i}", spec.host_mem_gb) for i in range(spec.nodes)]
        smaller = replace(cluster, **{pool: replace(spec, nodes=len(nodes) - 1,
                                                    node_list=tuple(n for n in nodes if n.node_id != node))})
        with pytest.raises(ClusterConflict, match=f"node '{node}' is held for a regrouping"):
            copy.reconcile(smaller, now)
        assert json.dumps(copy.snapshot(), sort_keys=True) == before
        tried.append(node)

    _live_replay(jobs, cluster, 300.0, "rollmux-regroup", on_step=remove_a_held_node)
    assert tried, "the trace must hold a node for a regrouping"


def test_a_restore_keeps_the_groups_a_regrouping_empties_closed():
    """A group marked closing stays closed to arrivals through a restore, also once no
    hold waits for its nodes any more (the mark lasts until the group is gone, in the
    simulator and before the restart); a snapshot without the marks falls back to
    those of the holds that still wait."""
    import json

    from rollmux.runtime.control import ControlPlane

    cp = ControlPlane(bounded(4, 4))
    rec = cp.submit(Job("a", 100.0, 100.0, slo=2.0, iterations=10), 0.0, "0" * 64)
    cp.plan.close_group(rec.group_id)
    snap = json.loads(json.dumps(cp.snapshot()))
    assert snap["globals"]["closing"] == [rec.group_id]
    back = ControlPlane.restore(snap)
    assert back.plan.closing == {rec.group_id}
    b = back.submit(Job("b", 100.0, 100.0, slo=2.0, iterations=10), 1.0, "0" * 64)
    assert b.group_id != rec.group_id  # unmarked, it packs there
    del snap["globals"]["closing"]
    assert ControlPlane.restore(snap).plan.closing == set()  # no hold: nothing to mark


@pytest.mark.parametrize("fault", ["cancel", "fail"])
def test_a_member_that_leaves_a_held_regrouping_loses_nothing(fault):
    """The first regrouping on a 4 + 4 cluster (it holds nodes) loses a member as soon as
    it is decided (cancelled) or a move fails; through restores every 4 steps, every
    other job still runs each iteration once and every node ends free, no hold left."""
    from test_live_moves import _live_replay

    jobs, cluster = queueing(0)
    out: dict = {}
    _live_replay(jobs, cluster, 300.0, "rollmux-regroup", restore_every=4, fault=fault, out=out)
    plane = out["plane"]
    assert plane.holds == {} and plane.regroups == {}
    assert plane.plan.free_count("rollout") == 4 and plane.plan.free_count("train") == 4


@pytest.mark.parametrize("policy,seed,backfill", [("rollmux", 0, True), ("rollmux", 7, True),
                                                  ("rollmux-consolidate", 11, True), ("rollmux", 0, False),
                                                  ("rollmux-consolidate", 11, False)])
def test_live_queue_on_bounded_pools_is_the_simulators(policy, seed, backfill):
    """The waiting line is served live as in the simulator, backfilled by packing or
    strictly first come, first placed: the same phases, placements and moves on a
    cluster where jobs queue (and, backfilled, jobs pass the line)."""
    from test_live_moves import _live_replay, _sim_record

    jobs, cluster = queueing(seed)
    sim = simulate([replace(j) for j in jobs], cluster, make_policy(policy), backfill=backfill)
    assert any(o.placed_s > o.arrival_s for o in sim.jobs), "the trace must queue"
    assert (sim.outcomes["backfilled"] >= 1) == backfill
    sim_phases, sim_moves, _ = _sim_record(jobs, cluster, 300.0, policy, backfill)
    live_phases, live_moves = _live_replay(jobs, cluster, 300.0, policy, backfill=backfill)
    assert sorted((j, f, t) for j, f, t, _ in live_moves) == sorted(sim_moves)
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)


@pytest.mark.parametrize("name,seed,every", [("rollmux-hedge", 10, 3), ("rollmux-hedge", 7, 0),
                                             ("rollmux-hedge", 42, 4), ("rollmux-full-regroup", 17, 3),
                                             ("rollmux-full-regroup", 0, 0)])
def test_live_regrouping_of_jobs_alone_on_bounded_pools_is_the_simulators(name, seed, every):
    """``rollmux-hedge`` (a fleet of one view) and ``rollmux-full-regroup`` on 4 + 4 nodes
    where jobs queue and jobs alone are regrouped within the inventory, also when the
    line's head is refused (every seed but 7): the same phases and moves live and in the
    simulator, through restores too."""
    from test_live_moves import _live_replay, _moves_of

    asked, r = _refusals(name, seed, None)
    assert r.outcomes["regrouped"] >= 1 and any(o.placed_s > o.arrival_s for o in r.jobs)
    assert (_gathered_at_refusals(asked) > 0) == (seed != 7)
    sim = [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]
    live, moves = _live_replay(*queueing(seed), 300.0, name, restore_every=every)
    assert sorted((j, f, t) for j, f, t, _ in moves) == sorted(_moves_of(sim))
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live, key=key) == sorted(sim, key=key)


class _Driver:
    """Runs a plane in virtual time: arrivals, phases of their worst-case length, moves
    acknowledged ``migration_s`` after they are decided; ``run(stop)`` goes on until
    ``stop(plane)`` or until nothing is left to happen."""

    def __init__(self, cp, jobs: list[Job], migration_s: float) -> None:
        self.cp, self.migration_s, self.by_id = cp, migration_s, {j.job_id: j for j in jobs}
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        for j in jobs:
            self._push(j.arrival_s, 1, j.job_id)

    def _push(self, at, kind, payload) -> None:
        import heapq

        heapq.heappush(self.heap, (at, kind, self.seq, payload))
        self.seq += 1

    def run(self, stop) -> None:
        import heapq

        from rollmux.colocation import worst_phase

        cp = self.cp
        while self.heap and not stop(cp):
            now, kind, _, payload = heapq.heappop(self.heap)
            self.now = now
            if kind == 1:
                cp.submit(self.by_id[payload], now, "0" * 64)
            elif not cp.record(payload[0] if kind == 0 else payload).live:
                continue
            elif kind == 0:
                cp.release(payload[0], payload[1], payload[2], 0.0, now)
            else:
                cp.moved(payload, now)
            for e in cp.take_changes().events:
                if e["kind"] == "grant":
                    group = cp.plan.groups[e["group_id"]]
                    member = group.member(e["job_id"])
                    body, extra = worst_phase(member.job, e["pool"], cp.cluster, group.colocated or member.hosted)
                    self._push(e["at"] + e["detail"]["switch_s"] + extra + body, 0,
                               (e["job_id"], e["pool"], e["seq"]))
                elif e["kind"] == "move":
                    self._push(e["at"] + self.migration_s, 2, e["job_id"])


def test_a_drained_node_leaves_a_hold_which_takes_another_and_nothing_is_lost():
    """Drain a node a live regrouping holds: it stays out of service, the hold wants one
    more node (taking a free one if there is), and the run still ends with every job done,
    no hold left, and every node but the drained one free."""
    from rollmux.runtime.control import ControlPlane

    jobs, cluster = queueing(0)
    cp = ControlPlane(cluster, policy="rollmux-regroup", migration_s=300.0)
    held = lambda plane: [(pool, n) for h in plane.holds.values()  # noqa: E731
                          for pool, nodes in h.held.items() for n in nodes]
    driver = _Driver(cp, jobs, 300.0)
    driver.run(lambda plane: bool(held(plane)))
    assert held(cp), "the trace must hold a node for a regrouping"
    (hold,) = cp.holds.values()
    pool, node = held(cp)[0]
    doc = cp.status(driver.now)  # what `rollmux status` shows: the held nodes and the regroupings
    assert doc["held"] == sorted(n for _, n in held(cp))
    assert doc["regroupings"] and all(r["held"] for r in doc["regroupings"])
    assert doc["nodes"][pool]["free"] == cp.plan.free_count(pool)
    wanted = sum(hold.want.values())
    free_before = cp.plan.free_count(pool)
    cp.drain(node, now=driver.now)
    assert (pool, node) not in held(cp)
    took = free_before - cp.plan.free_count(pool)
    assert sum(hold.want.values()) == wanted + 1 - took
    assert node not in cp.plan._free[pool]
    driver.run(lambda plane: False)
    assert all(not r.live for r in cp.jobs.values())
    assert cp.holds == {} and cp.regroups == {}
    other = "train" if pool == "rollout" else "rollout"
    assert cp.plan.free_count(pool) == 3 and cp.plan.free_count(other) == 4 and node not in cp.plan._free[pool]


def test_plan_time_regrouping_on_a_bounded_fleet_stays_within_its_pools():
    """``rollmux fleet plan`` on the bounded three-type example: the exact regrouping
    (``improve_fleet``) now runs there, lowers the plan's E and never holds more nodes
    of a pool than the pool has."""
    from pathlib import Path

    from rollmux.fleet import load_profiles
    from rollmux.fleet_exact import improve_fleet
    from rollmux.fleet_file import load_fleet
    from rollmux.fleet_planner import FleetPlanner, plan_jobs
    from rollmux.traces.format import read_trace

    example = Path(__file__).resolve().parents[1] / "examples" / "fleet"
    fleet = load_fleet(example / "three_types_bounded.yaml")
    profiles = load_profiles(example / "profiles.csv", fleet)
    jobs = read_trace(example / "jobs.csv")
    state, _ = plan_jobs(FleetPlanner(fleet, profiles), jobs)
    before = state.effective_cost_per_hour()
    result = improve_fleet(state)
    assert result.moves and result.cost_before == pytest.approx(before) and result.cost_after < before
    assert state.effective_cost_per_hour() == pytest.approx(result.cost_after)
    for pool in fleet.pools:
        assert state.nodes_in_use(pool.name) <= pool.nodes
        assert state.nodes_in_use(pool.name) + state.free_nodes(pool.name) == pool.nodes


def _stranding_plane() -> tuple[ControlPlane, list[float]]:
    """Two nodes per pool, ``rollmux-regroup``: x and y share g0 (R0, T0), z runs alone in
    g1 (R1, T1); when y completes, the regrouping {x, z} into one group (two rollout
    nodes, one training node) is decided, its nodes held as g0 and g1 give them back."""
    from rollmux.model import PoolSpec

    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                      switch_cost=SwitchCost("fixed", 0.0, 0.0))
    cp = ControlPlane(cluster, policy="rollmux-regroup")
    for job in (Job("x", 100, 20, slo=2.0, iterations=200), Job("y", 20, 100, slo=2.0, iterations=5),
                Job("z", 100, 20, slo=2.0, iterations=200)):
        cp.submit(job, 0.0, "0" * 64)
    clock = [0.0]
    while not cp.regroups:
        assert _step(cp, clock), "the regrouping was never decided"
    return cp, clock


def _step(cp: ControlPlane, clock: list[float]) -> bool:
    """Acknowledge a pending move, else release the oldest grant at its phase's end; False
    when no job holds a grant or has a move to make."""
    movers = [r for r in cp.jobs.values() if r.live and cp.pending_move(r.job_id)]
    if movers:
        clock[0] += 10
        cp.moved(movers[0].job_id, clock[0])
        return True
    holders = [r for r in cp.jobs.values() if r.live and r.grant is not None]
    if not holders:
        return False
    rec = min(holders, key=lambda r: r.grant.granted_at)
    clock[0] = max(clock[0], rec.grant.granted_at) + (rec.job.t_roll_s if rec.grant.pool == "rollout"
                                                      else rec.job.t_train_s)
    cp.release(rec.job_id, rec.grant.pool, rec.grant.seq, 1.0, clock[0])
    return True


def test_a_regrouped_job_whose_partner_left_is_not_stranded_beside_an_open_ended_arrival():
    """(an auditor's case) z is cancelled before its boundary, its nodes go to an
    open-ended arrival w, and the held nodes no longer cover the two-member group: x
    stopped at its boundary and then waited outside any group for ever. It is now placed
    afresh and runs on."""
    cp, clock = _stranding_plane()
    clock[0] += 1
    cp.cancel("z", clock[0])
    cp.submit(Job("w", 100, 20, slo=2.0, iterations=None), clock[0], "1" * 64)
    before = cp.record("x").iterations_done
    for _ in range(400):
        assert _step(cp, clock)
    x = cp.record("x")
    assert x.last_move is not None and x.last_move["outcome"] == "undone", x.last_move  # it did stop
    assert x.group_id is not None and x.iterations_done > before + 20, x
    assert not cp.regroups and not cp.holds
    again = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), policy="rollmux-regroup")
    assert again.snapshot() == cp.snapshot()


def test_draining_a_node_a_regrouping_holds_does_not_strand_its_jobs():
    """(an auditor's case) R0 drained right after the decision: the hold gave it up and
    waited for a rollout node no emptied group would give back, x and z stopped with no
    group for ever while R1, T0 and T1 sat idle. Both now run to their end."""
    cp, clock = _stranding_plane()
    cp.drain("R0", clock[0])
    for _ in range(5000):
        if not _step(cp, clock):
            break
    assert [cp.jobs[j].state for j in "xyz"] == ["done"] * 3
    assert cp.jobs["x"].iterations_done == cp.jobs["z"].iterations_done == 200
