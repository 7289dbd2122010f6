"""``rollmux serve`` on a fleet of GPU types: the live control plane places each job on
its pair of types through the fleet planner (both spaces, both objectives), phase for
phase as ``rollmux fleet simulate`` does (through restores too), on physical nodes that
no two views share, and keeps the fleet and its profiles in its state."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.fleet import Profiles, load_profiles
from rollmux.fleet_file import fleet_from_dict, fleet_to_dict, load_fleet
from rollmux.model import Cluster, Job
from rollmux.policies import make_policy
from rollmux.policies.fleet import FLEET_ROLLMUX, fleet_rollmux
from rollmux.runtime.control import (FLEET_LIVE_POLICIES, ClusterConflict, ControlError, ControlPlane, NeverFits)
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace
from rollmux.traces.format import read_trace
from rollmux.traces.generate import generate
from test_live_moves import _live_replay, _moves_of

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fleet"


def _example(bounds: dict[str, int] | None = None):
    fleet = load_fleet(EXAMPLE / "three_types.yaml")
    if bounds:
        fleet = dataclasses.replace(fleet, pools=tuple(dataclasses.replace(p, nodes=bounds[p.name])
                                                       for p in fleet.pools))
    jobs = read_trace(EXAMPLE / "jobs.csv")
    for j in jobs:  # a fixed length, as the live service runs a job
        j.iterations, j.duration_s = j.solo_iterations(), None
    return fleet, load_profiles(EXAMPLE / "profiles.csv", fleet), jobs


def _sim_phases(jobs, fleet, profiles, policy: str = "rollmux") -> list:
    r = simulate(jobs, fleet.views()[0].cluster, fleet_rollmux(fleet, profiles, policy), record_spans=True)
    assert not r.rejected and (r.bounded or r.slo_attainment == 1.0)  # bounded: waiting counts end to end
    if "full" in policy:
        assert r.outcomes["co-located"] >= 1, "the trace must co-locate"
    return [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]


@pytest.mark.parametrize("policy,bounds,every", [
    ("rollmux", None, 0), ("rollmux", None, 5), ("rollmux", {"H20": 6, "H800": 4, "H200": 3}, 0),
    ("rollmux", {"H20": 2, "H800": 2, "H200": 2}, 7), ("rollmux-full", None, 4), ("rollmux-lifetime", None, 0),
    ("rollmux-full-lifetime", None, 3), ("rollmux-full-lifetime", {"H20": 3, "H800": 3, "H200": 3}, 0)])
def test_a_live_fleet_is_the_fleet_simulators_phase_for_phase(policy, bounds, every):
    fleet, profiles, jobs = _example(bounds)
    sim = _sim_phases(jobs, fleet, profiles, policy)
    live, moves = _live_replay(jobs, fleet, 300.0, policy, restore_every=every, profiles=profiles)
    assert moves == []
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live, key=key) == sorted(sim, key=key)
    views = {gid.split(":", 1)[0] for _, _, gid, _, _ in live}
    assert len(views) >= 2, "the trace must use several pairs of types"
    nodes = {n for *_, ns, _ in live for n in ns}
    assert all(n.rsplit("-", 1)[0] in {"H20", "H800", "H200"} for n in nodes), "physical node ids"
    if bounds:  # a bounded pool's nodes are its own, whatever views use them
        assert all(int(n.rsplit("-", 1)[1]) < bounds[n.rsplit("-", 1)[0]] for n in nodes)


@pytest.mark.parametrize("policy,seed,every", [("rollmux-regroup", 0, 0), ("rollmux-full-regroup", 0, 0),
                                               ("rollmux-full-regroup", 2, 0), ("rollmux-full-regroup", 4, 3),
                                               ("rollmux-hedge", 0, 2)])
def test_a_live_fleet_regroups_as_the_fleet_simulator_decision_for_decision(policy, seed, every):
    """Regroupings inside a view and a lone job's move to another view (``plan_fleet_regroup``),
    live as in ``rollmux fleet simulate``: the same moves at the same instants, the same
    phases on the same physical nodes, through restores too."""
    fleet = load_fleet(EXAMPLE / "three_types.yaml")
    jobs = generate(14, seed=seed, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    policy_obj = fleet_rollmux(fleet, Profiles(), policy)
    r = simulate(jobs, fleet.views()[0].cluster, policy_obj, record_spans=True, migration_s=300.0)
    assert r.slo_attainment == 1.0 and r.outcomes["regrouped"] >= 1, "the trace must regroup"
    sim = [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]
    live, moves = _live_replay(jobs, fleet, 300.0, policy, restore_every=every, profiles=Profiles())
    assert sorted((j, f, t) for j, f, t, _ in moves) == sorted(_moves_of(sim))
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live, key=key) == sorted(sim, key=key)
    if policy == "rollmux-full-regroup":  # a lone job moved to another pair of types
        assert any(f.split(":", 1)[0] != t.split(":", 1)[0] for _, f, t, _ in moves)


def test_a_two_pool_plane_runs_rollmux_hedge_as_a_fleet_of_one_view_decision_for_decision():
    """``rollmux serve --policy rollmux-hedge`` on a two-pool cluster plans on it as a fleet
    of one view, as ``rollmux simulate --policies rollmux-hedge`` does: the same moves at
    the same instants and the same phases on the same nodes, through restores too."""
    cluster = Cluster()
    jobs = generate(12, seed=3, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    r = simulate(jobs, cluster, make_policy("rollmux-hedge", cluster=cluster), record_spans=True, migration_s=300.0)
    assert r.slo_attainment == 1.0 and r.outcomes["regrouped"] >= 1, "the trace must pair jobs"
    sim = [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]
    live, moves = _live_replay(jobs, cluster, 300.0, "rollmux-hedge", restore_every=3)
    assert sorted((j, f, t) for j, f, t, _ in moves) == sorted(_moves_of(sim))
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live, key=key) == sorted(sim, key=key)
    # a restart with the same cluster file keeps the state; another cluster is refused
    cp = ControlPlane(cluster, policy="rollmux-hedge")
    assert cp.fleet is not None
    assert cp.reconcile(Cluster(), 1.0) == {"added": [], "removed": [], "changed": [], "placed": []}
    dearer = dataclasses.replace(cluster, train=dataclasses.replace(cluster.train, price_per_gpu_hour=9.0))
    with pytest.raises(ClusterConflict) as err:
        cp.reconcile(dearer, 1.0)
    assert err.value.field == "pools"


def test_a_submit_is_answered_before_its_arrivals_regrouping_which_runs_before_anything_else():
    """Under ``rollmux-hedge`` a submit that opens a group answers with the placement and
    leaves the gathering it asks for pending (persisted with the state); ``gather``, or
    the next change, runs it as at the arrival: the same regrouping as right away, decided
    at the arrival's time, also after a restart in between."""
    a = Job("a", 100.0, 100.0, slo=1.5, iterations=1000)
    b = Job("b", 100.0, 100.0, slo=1.5, iterations=1000)
    planes = {way: ControlPlane(Cluster(), policy="rollmux-hedge") for way in ("gather", "next change", "restart")}
    for cp in planes.values():
        cp.submit(a, 0.0, "0" * 64)
        cp.gather()  # a alone: nobody to gather with
        cp.submit(b, 60.0, "0" * 64)
        assert cp.gathers_pending and cp.regroups == {}  # answered first
    planes["gather"].gather()
    planes["next change"].report_progress("a", 0.5)  # any change runs the pending gathering first
    snap = json.loads(json.dumps(planes["restart"].snapshot()))
    planes["restart"] = ControlPlane.restore(snap, policy="rollmux-hedge")
    assert planes["restart"].gathers_pending
    planes["restart"].gather()
    decided = {way: [(sorted(m["job_id"] for m in e["group"]["members"]), e["decided_at"])
                     for e in cp.regroups.values()] for way, cp in planes.items()}
    assert decided["gather"] == [(["a", "b"], 60.0)]
    assert decided["next change"] == decided["restart"] == decided["gather"]
    assert not any(cp.gathers_pending for cp in planes.values())


def test_a_job_alone_gathers_two_others_live_as_in_the_simulator():
    """``rollmux-hedge``'s gathering of three jobs alone into one group (six production
    8B_32k jobs and two others, drawn with a fixed seed): the plane makes the same moves
    at the same instants as the simulator, three groups replaced by one, and runs the
    same phases on the same nodes, through restores."""
    import random

    cluster = Cluster()
    rows = load_trace("production")[0]
    rng = random.Random(13)
    picked = rng.sample([r for r in rows if r.model == "8B_32k"], 6) + rng.sample(rows, 2)
    jobs = []
    for i, j in enumerate(sorted(picked, key=lambda j: j.arrival_s)):
        iterations = rng.randint(20, 80)
        jobs.append(dataclasses.replace(j, job_id=f"p{i}", arrival_s=rng.choice((300.0, 900.0, 3000.0)) * i,
                                        duration_s=None, iterations=iterations))
    policy = make_policy("rollmux-hedge", cluster=cluster)
    replaced = []
    regroup = policy.regroup

    def recorded(*args, **kwargs):
        plan = regroup(*args, **kwargs)
        if plan is not None:
            replaced.append(len(plan.replaced))
        return plan

    policy.regroup = recorded
    r = simulate(jobs, cluster, policy, record_spans=True, migration_s=300.0)
    assert r.slo_attainment == 1.0 and 3 in replaced, f"the trace must gather three jobs: {replaced}"
    sim = [(job, pool, gid, tuple(nodes), start) for gid, job, pool, nodes, start, *_ in r.spans]
    live, moves = _live_replay(jobs, cluster, 300.0, "rollmux-hedge", restore_every=3)
    assert sorted((j, f, t) for j, f, t, _ in moves) == sorted(_moves_of(sim))
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live, key=key) == sorted(sim, key=key)


def test_no_node_is_held_by_two_groups_at_once_across_views():
    fleet, profiles, jobs = _example({"H20": 3, "H800": 3, "H200": 2})
    cp = ControlPlane(fleet, profiles=profiles)
    for i, job in enumerate(jobs):
        cp.submit(job, float(i), "0" * 64)
        holders: dict[str, str] = {}
        for gid, group in cp.plan.groups.items():
            for node in [*group.rollout_nodes, *group.train_nodes]:
                assert holders.setdefault(node, gid) == gid, f"{node} in {holders[node]} and {gid}"
        for pool in fleet.pools:
            assert cp.plan.nodes_in_use(pool.name) + cp.plan.free_count(pool.name) == pool.nodes
    assert cp.waiting, "the bounded fleet must make a job wait"
    status = cp.status(10.0)
    assert set(status["nodes"]) == {"H20", "H800", "H200"}
    assert all(g["view"] == g["group_id"].split(":", 1)[0] for g in status["groups"])


def test_a_job_sees_each_views_verdict_and_its_times_on_its_types():
    fleet, profiles, jobs = _example()
    cp = ControlPlane(fleet, profiles=profiles)
    rec = None
    for i, job in enumerate(jobs):
        rec = cp.submit(job, float(i), "0" * 64)
    long_a = cp.record("long-a")
    assert any(line.startswith("view H20/H20: slower than its SLO") for line in long_a.explanation)
    chosen = [line for line in long_a.explanation if line.startswith("view ") and line.endswith(" chosen")]
    assert len(chosen) == 1 and chosen[0].startswith(f"view {long_a.group_id.split(':')[0]}: +$")
    member = cp.plan.groups[long_a.group_id].member("long-a")
    (row,) = [j for j in cp.status(20.0)["jobs"] if j["job_id"] == "long-a"]
    assert row["profile_s"]["rollout"] == member.job.t_roll_s  # its time on its group's rollout type
    if member.job.t_roll_s != long_a.job.t_roll_s:
        assert row["profile_s"]["rollout"] != long_a.job.t_roll_s
    assert rec is not None and rec.state == "placed"


def test_drain_on_a_fleet_withholds_the_physical_node_from_every_view():
    fleet, profiles, jobs = _example({"H20": 1, "H800": 1, "H200": 1})
    cp = ControlPlane(fleet, profiles=profiles)
    assert cp.drain("H200-0", 0.0) == [] and cp.plan.free_count("H200") == 0
    first = cp.submit(jobs[0], 1.0, "0" * 64)
    assert (first.rollout_nodes, first.train_nodes) == (("H20-0",), ("H800-0",))
    assert "view H20/H200: inventory: H200 has 0 free nodes, needs 1" in first.explanation
    assert cp.drain("H800-0", 2.0) == [first.job_id]  # pinned: it stays until the job departs
    cp.complete(first.job_id, 3.0)
    assert {p.name: cp.plan.free_count(p.name) for p in fleet.pools} == {"H20": 1, "H800": 0, "H200": 0}
    assert cp.undrain("H200-0", 4.0) == [] and cp.plan.free_count("H200") == 1
    second = cp.submit(jobs[1], 5.0, "0" * 64)  # H800 is drained: the H200 node serves as training node
    assert (second.group_id, second.rollout_nodes, second.train_nodes) == ("H20/H200:g0", ("H20-0",), ("H200-0",))
    with pytest.raises(ControlError) as err:
        cp.drain("R0", 6.0)
    assert err.value.field == "node"


def test_a_fleet_plane_refuses_what_it_cannot_do_and_changes_nothing():
    fleet, profiles, jobs = _example()
    assert FLEET_LIVE_POLICIES == ("rollmux", "rollmux-full", "rollmux-lifetime", "rollmux-full-lifetime",
                                   "rollmux-regroup", "rollmux-full-regroup", "rollmux-hedge")
    with pytest.raises(ControlError, match="on a fleet of GPU types the live service runs rollmux") as err:
        ControlPlane(fleet, policy="rollmux-consolidate")
    assert err.value.field == "policy"
    with pytest.raises(ControlError) as err:
        ControlPlane(Cluster(), profiles=Profiles())
    assert err.value.field == "profiles"
    cp = ControlPlane(fleet, profiles=profiles)
    cp.submit(jobs[0], 0.0, "0" * 64)
    before = json.dumps(cp.snapshot(), sort_keys=True)
    with pytest.raises(ControlError) as err:
        cp.add_node("H20", "", None, 1.0)
    assert err.value.field == "pool"
    with pytest.raises(ClusterConflict) as err:
        cp.reconcile(Cluster(), 1.0)
    assert err.value.field == "cluster"
    bigger = dataclasses.replace(fleet, max_group_size=3)
    with pytest.raises(ClusterConflict) as err:
        cp.reconcile(bigger, 1.0)
    assert err.value.field == "pools"
    assert cp.reconcile(fleet, 1.0) == {"added": [], "removed": [], "changed": [], "placed": []}
    assert cp.reconcile(fleet, 1.0, profiles) == {"added": [], "removed": [], "changed": [], "placed": []}
    with pytest.raises(ClusterConflict) as err:
        cp.reconcile(fleet, 1.0, Profiles())
    assert err.value.field == "profiles"
    # a job no pair of types can serve within its SLO
    hopeless = Job("hopeless", 400.0, 400.0, 8, 8, 100.0, 100.0, 1.0, "7B_8k", iterations=10)
    slow = {("hopeless", p.gpu): (5000.0, None) for p in fleet.pools}  # slower than its SLO everywhere
    strict = ControlPlane(fleet, profiles=Profiles(slow))
    with pytest.raises(NeverFits) as err:
        strict.submit(hopeless, 0.0, "0" * 64)
    assert err.value.field == "slo"
    assert json.dumps(cp.snapshot(), sort_keys=True) == before


def test_a_fleet_survives_its_state_file_and_restores_exactly():
    fleet, profiles, jobs = _example({"H20": 4, "H800": 3, "H200": 2})
    cp = ControlPlane(fleet, profiles=profiles)
    for i, job in enumerate(jobs[:6]):
        cp.submit(job, float(i), "0" * 64)
    snap = json.loads(json.dumps(cp.snapshot()))
    assert snap["cluster"]["fleet"] == fleet_to_dict(fleet)
    again = ControlPlane.restore(snap)
    assert again.fleet == fleet and again.profiles == profiles
    assert dict(again.plan.groups) == dict(cp.plan.groups)
    assert again.plan.inventory() == cp.plan.inventory()
    assert again.plan.cost_per_hour() == pytest.approx(cp.plan.cost_per_hour())
    for gid in cp.plan.groups:
        assert again.plan.analysis(gid).iteration_s == cp.plan.analysis(gid).iteration_s
    # the next arrival is placed alike in both
    nxt = jobs[6]
    a, b = cp.submit(nxt, 7.0, "0" * 64), again.submit(nxt, 7.0, "0" * 64)
    assert (a.group_id, a.rollout_nodes, a.train_nodes) == (b.group_id, b.rollout_nodes, b.train_nodes)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), min_size=1, max_size=30),
       st.sampled_from(list(FLEET_ROLLMUX)))
def test_any_sequence_of_arrivals_and_departures_keeps_every_node_in_one_place(ops, policy):
    """Random submits and completions on a small bounded fleet: every node of a pool is
    free, in exactly one group or held for exactly one pending regrouping (``cp.holds``),
    and the waiting line is retried in order."""
    fleet, profiles, jobs = _example({"H20": 2, "H800": 3, "H200": 2})
    cp = ControlPlane(fleet, profiles=profiles, policy=policy)
    now = 0.0
    for arrive, k in ops:
        now += 1.0
        job = jobs[k]
        rec = cp.jobs.get(job.job_id)
        if arrive and (rec is None or not rec.live):
            cp.submit(job, now, "0" * 64)
        elif not arrive and rec is not None and rec.live:
            cp.complete(job.job_id, now)
        holder: dict[str, str] = {}
        for gid, group in cp.plan.groups.items():
            for node in {*group.rollout_nodes, *group.train_nodes}:
                assert holder.setdefault(node, gid) == gid
        reserved = [n for h in cp.holds.values() for nodes in h.held.values() for n in nodes]
        assert len(reserved) == len(set(reserved)) and not set(reserved) & set(holder)
        for pool in fleet.pools:
            free = cp.plan._free[pool.name]
            held = {n for n in holder if n.rsplit("-", 1)[0] == pool.name}
            mine = {n for n in reserved if n.rsplit("-", 1)[0] == pool.name}
            assert not (held | mine) & set(free) and len(held) + len(mine) + len(free) == pool.nodes
        for job_id in cp.waiting:  # a waiting job has no group and its record says so
            assert cp.record(job_id).state == "waiting" and job_id not in cp.plan.job_group


def test_a_job_colocated_on_a_pool_that_only_trains_holds_one_node_of_that_pool():
    """Co-location on a training-only pool is offered in a view whose rollout pool is
    another one; the co-located node is a training node, the same on both sides."""
    fleet = fleet_from_dict({"pools": [{"gpu": "H20", "roles": ["rollout"], "nodes": 2},
                                       {"gpu": "H800", "roles": ["train"], "nodes": 2}],
                             "switch_cost_s": 0})
    job = Job("c", 100.0, 300.0, 8, 8, 100.0, 100.0, 1.5, "7B_8k", iterations=20, t_roll_colo_s=90.0,
              t_train_colo_s=300.0)
    cp = ControlPlane(fleet, policy="rollmux-full")
    rec = cp.submit(job, 0.0, "0" * 64)
    assert rec.outcome == "co-located", rec.explanation
    assert rec.rollout_nodes == rec.train_nodes == ("H800-0",)
    assert cp.plan.free_count("H800") == 1 and cp.plan.free_count("H20") == 2
    cp.complete("c", 1.0)
    assert cp.plan.free_count("H800") == 2
