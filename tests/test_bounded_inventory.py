"""Options that a bounded pool's inventory can never hold (``planner``, "Inventory"): an
option that needs more nodes of a pool than the pool has in all is never chosen, waited
for, or allowed to block a job that another option of the policy can run; a job none of
whose options can ever run is rejected, naming the pool."""
from __future__ import annotations

from dataclasses import replace

import pytest

from rollmux import colocation
from rollmux.errors import CapacityError
from rollmux.fleet import Profiles, fleet_of
from rollmux.fleet_planner import FleetPlanner, plan_jobs
from rollmux.model import Cluster, Job
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, Planner
from rollmux.policies import make_policy
from rollmux.policies.fleet import FleetAlone, fleet_rollmux
from rollmux.policies.gavel import Gavel
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace
from rollmux.traces.generate import generate

#: policies with more than one kind of option, co-location among them
CHOOSERS = ["gavel", "rollmux-hedge", "rollmux-full", "rollmux-full-regroup", "rollmux-full-lifetime",
            "gavel+ (fleet)", "rollmux-full (fleet)"]


def bounded(rollout: int | None, train: int | None = None) -> Cluster:
    base = Cluster()
    return replace(base, rollout=replace(base.rollout, nodes=rollout), train=replace(base.train, nodes=train))


def policy(name: str, cluster: Cluster):
    if name == "gavel+ (fleet)":
        return FleetAlone(fleet_of(cluster), Profiles(), "gavel+", gavel=True)
    if name == "rollmux-full (fleet)":
        return fleet_rollmux(fleet_of(cluster), Profiles(), "rollmux-full")
    return make_policy(name, cluster=cluster)


def run(jobs: list[Job], cluster: Cluster, name: str):
    """Simulate, checking at every plan change that no pool holds more nodes than it has."""
    limits = {"rollout": cluster.rollout.nodes, "train": cluster.train.nodes}

    def watch(now, state):
        for side, limit in limits.items():
            assert limit is None or state.gpus_in_use(side) <= limit * cluster.gpus_per_node, (now, side)

    return simulate([replace(j) for j in jobs], cluster, policy(name, cluster), on_change=watch)


def production() -> dict[str, Job]:
    return {j.job_id: j for j in load_trace("production", Cluster())[0]}


@pytest.mark.parametrize("name", CHOOSERS)
def test_without_rollout_nodes_every_job_that_fits_co_located_runs_co_located_at_once(name):
    """The first 12 production jobs on a cluster of training nodes only: each fits a
    training node co-located within its SLO, and Gavel+ prices job8 and job10 cheaper
    disaggregated (an option the empty rollout pool never holds: it rejected them, and
    rollmux-hedge waited for it for ever; the full-space planner rejected every job)."""
    cluster = bounded(0)
    jobs = load_trace("production", cluster)[0][:12]
    assert all(colocation.fits(j, cluster) and colocation.slowdown(j, cluster) <= j.slo for j in jobs)
    assert [j.job_id for j in jobs if not Gavel().colocate(j, Cluster())] == ["job8", "job10"]
    r = run(jobs, cluster, name)
    assert not r.rejected and len(r.jobs) == len(jobs)
    assert all(o.wait_s == 0 for o in r.jobs) and r.peak_gpus["rollout"] == 0


@pytest.mark.parametrize("name", CHOOSERS)
def test_on_one_rollout_node_a_job_needing_two_runs_co_located(name):
    """job8's shape on 2 + 2 nodes (Gavel+ prices it cheaper disaggregated) and a small job
    behind it on a cluster of one rollout node: the big job can only ever run co-located,
    and does so at once; the job behind it is not held up."""
    prod = production()
    big = replace(prod["job8"], job_id="big", rollout_gpus=16, train_gpus=16, arrival_s=0.0)
    small = replace(prod["job9"], job_id="small", arrival_s=1.0)
    assert not Gavel().colocate(big, Cluster())
    r = run([big, small], bounded(1), name)
    assert not r.rejected and {o.job_id for o in r.jobs} == {"big", "small"}
    assert all(o.wait_s == 0 for o in r.jobs)


@pytest.mark.parametrize("name", [*CHOOSERS, "colocated", "rollmux", "rollmux-host"])
def test_a_job_that_fits_no_option_is_rejected_naming_the_pool(name):
    """On one training node a 2 + 2-node job fits no option of any policy: rejected, naming
    the training pool; the job behind it runs."""
    prod = production()
    big = replace(prod["job22"], job_id="big", arrival_s=0.0)
    small = replace(prod["job9"], job_id="small", arrival_s=1.0)
    r = run([big, small], bounded(None, 1), name)
    assert r.rejected == ["big"] and "needs 2 train nodes, the pool has 1" in r.reject_reasons["big"]
    assert [o.job_id for o in r.jobs] == ["small"] and r.jobs[0].wait_s == 0


def test_a_job_that_misses_its_slo_co_located_is_rejected_by_rollmux_and_run_by_the_baselines():
    """Without rollout nodes job21 (co-located 1.328 > its SLO 1.151) has no option the
    planner may take: rollmux-full rejects it, naming the pool and the SLO, while Gavel+
    and rollmux-hedge run it co-located, as the ``colocated`` baseline does."""
    cluster = bounded(0)
    job = replace(production()["job21"], arrival_s=0.0)
    with pytest.raises(CapacityError) as info:  # a run that places no job is an error naming the pool
        run([job], cluster, "rollmux-full")
    assert info.value.pools == ("rollout",)
    assert "needs 1 rollout nodes, the pool has 0; co-located 1.328 > its SLO 1.151" in str(info.value)
    for name in ("gavel", "rollmux-hedge", "colocated"):
        r = run([job], cluster, name)
        assert not r.rejected and r.jobs[0].wait_s == 0, name


def test_hosting_takes_a_job_no_rollout_pool_could_hold_and_never_waits_for_a_host():
    """``rollmux-host`` on one rollout node: a 2 + 2-node job is hosted on the training
    nodes of a group that has room (before, it was rejected); with no such group it is
    rejected at once (no node could free up for it), so the job behind it is not held up."""
    cluster = bounded(1)
    host = Job("host", 1000.0, 100.0, rollout_gpus=8, train_gpus=16, slo=2.0, iterations=50)
    guest = Job("guest", 60.0, 40.0, rollout_gpus=16, train_gpus=16, slo=2.0, arrival_s=10.0, iterations=50)
    r = run([host, guest], cluster, "rollmux-host")
    assert not r.rejected and {o.job_id: o.outcome for o in r.jobs} == {"host": "new-group", "guest": "hosted"}
    r = run([replace(guest, arrival_s=0.0), replace(host, arrival_s=10.0)], cluster, "rollmux-host")
    assert r.rejected == ["guest"]
    assert r.reject_reasons["guest"] == "needs 2 rollout nodes, the pool has 1; no group can host it"
    assert [(o.job_id, o.wait_s) for o in r.jobs] == [("host", 0.0)]


@pytest.mark.parametrize("name", ["rollmux-full", "rollmux-full (fleet)"])
def test_co_location_is_not_refused_for_a_pair_the_inventory_could_never_hold(name):
    """One rollout node, held by job a (co-located it would miss its SLO). Job b's cheaper
    options all need a second rollout node: scaling a's group (a group of two rollout
    nodes) and the pair the co-location prospect test priced (each its own rollout node,
    one training node). So b runs co-located at once (before, it waited 44,000 s for a to
    end)."""
    a = Job("a", 1000.0, 100.0, slo=1.05, iterations=40)
    b = Job("b", 1000.0, 100.0, slo=1.2, arrival_s=5.0, iterations=40)
    assert colocation.slowdown(a, Cluster()) > a.slo >= 1.0 and colocation.slowdown(b, Cluster()) <= b.slo
    r = run([a, b], bounded(1), name)
    assert {o.job_id: (o.outcome, o.wait_s) for o in r.jobs} == {"a": ("new-group", 0.0), "b": ("co-located", 0.0)}
    share = Planner(space=FULL_SPACE).shared_cost(PlanState(bounded(0)), b, {"rollout": 1, "train": 1})
    assert share == float("inf")  # no pair on no rollout node


def test_a_fleet_view_never_offers_a_candidate_its_inventory_could_never_hold():
    """The fleet planner's views plan on unbounded clusters: given the view's inventory,
    the planner no longer offers to scale a group holding the only rollout node by
    another one (the view's choice, which the fleet then waited for)."""
    cluster = bounded(1)
    planner = FleetPlanner(fleet_of(cluster), Profiles(), space=FULL_SPACE)
    a = Job("a", 1000.0, 100.0, slo=1.05, iterations=40)
    b = Job("b", 1000.0, 100.0, slo=1.2, arrival_s=5.0, iterations=40)
    state = planner.new_state()
    state.apply(a, planner.decide(state, a).decision.placement)
    d = planner.decide(state, b, explain=True)
    assert d.decision.outcome == "co-located"
    offered = [c for v in d.verdicts for c in v.decision.candidates if c.placement is not None]
    assert offered and all(not c.placement.new_rollout for c in offered if c.group_id is not None)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_on_a_view_with_an_inventory_both_paths_of_the_planner_choose_alike(seed):
    """25 generated jobs, all present at once, on one rollout node: the fast path and the
    explained one skip the same candidates, so they decide alike, and a job on two
    rollout nodes is co-located or rejected (naming the pool), never left waiting."""
    cluster = bounded(1)
    jobs = generate(25, seed=seed, mean_interarrival_s=600.0)
    planner = FleetPlanner(fleet_of(cluster), Profiles(), space=FULL_SPACE)
    fast, explained = (plan_jobs(planner, jobs, explain=e)[1] for e in (False, True))
    assert [(d.job_id, d.outcome, d.placement) for d in fast] == [(d.job_id, d.outcome, d.placement)
                                                                  for d in explained]
    wide = [d for d, j in zip(fast, sorted(jobs, key=lambda j: j.arrival_s)) if j.nodes("rollout", 8) == 2]
    assert wide and any(d.outcome == "co-located" for d in wide)
    assert all(d.outcome == "co-located" or (d.outcome == "rejected" and "the pool has 1" in d.reason) for d in wide)


def test_gavel_over_types_charges_a_wait_to_the_pool_it_waits_for():
    """No rollout nodes, one training node: the second job waits for the training node
    (its only option that can ever run), and its wait is charged there, not to the empty
    rollout pool of the disaggregated option Gavel+ would price first."""
    prod = production()
    jobs = [replace(prod["job8"], arrival_s=0.0), replace(prod["job10"], arrival_s=1.0, duration_s=20_000.0)]
    r = run(jobs, bounded(0, 1), "gavel+ (fleet)")
    assert not r.rejected and r.jobs[1].wait_s > 0
    assert r.limiting_pool == "train" and r.binding_s["rollout"] == 0
