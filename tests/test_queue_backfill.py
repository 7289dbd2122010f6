"""The waiting line on bounded pools, backfilled by packing (the default) or strictly first
come, first placed: a job behind the line's head passes it only when the policy packs it
into a running group on that group's own nodes, in the simulator and the live plane
alike, and never by taking a free node."""
from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.model import Cluster, Job, SwitchCost
from rollmux.policies import make_policy
from rollmux.runtime.control import WAITING, ControlPlane
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate


def _two_by_two() -> Cluster:
    base = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    return replace(base, rollout=replace(base.rollout, nodes=2), train=replace(base.train, nodes=2))


def _line() -> list[Job]:
    """On 2 + 2 nodes: ``a`` opens a group on one node per pool; ``big`` needs both nodes of
    each pool and heads the line until ``a``'s group is gone; ``small`` packs into ``a``'s
    group (it has slack for the company) and runs longer than ``a``; ``strict`` shares
    with nobody (SLO 1.0), so it would open a group on the free nodes: that is not a pack,
    and it waits in turn."""
    return [Job("a", 100.0, 100.0, slo=2.0, arrival_s=0.0, iterations=50),
            Job("big", 100.0, 100.0, 16, 16, slo=2.0, arrival_s=10.0, iterations=5),
            Job("small", 100.0, 100.0, slo=2.0, arrival_s=20.0, iterations=80),
            Job("strict", 100.0, 100.0, slo=1.0, arrival_s=30.0, iterations=5)]


def _starts(backfill: bool) -> tuple[dict[str, float], dict[str, str], object]:
    r = simulate(_line(), _two_by_two(), make_policy("rollmux"), record_spans=True, backfill=backfill)
    groups = {job: gid for gid, job, *_ in r.spans}
    return {o.job_id: o.placed_s for o in r.jobs}, groups, r


def test_a_job_that_packs_passes_the_line_and_one_that_needs_free_nodes_does_not():
    starts, groups, r = _starts(backfill=True)
    assert starts["small"] == 20.0 and groups["small"] == groups["a"]  # packed at its arrival
    assert r.outcomes["backfilled"] == 1
    assert starts["strict"] >= starts["big"] > 10.0  # behind the head, in turn
    fifo, _, r_fifo = _starts(backfill=False)
    assert fifo["small"] >= fifo["big"] > 10.0 and not r_fifo.outcomes.get("backfilled")
    assert fifo["strict"] >= fifo["small"]
    # the price of passing: ``small`` keeps a's nodes busy for longer, so the head starts later
    assert starts["big"] > fifo["big"]


def test_the_live_plane_passes_the_same_job_says_why_and_keeps_it_through_a_restore():
    for backfill in (True, False):
        cp = ControlPlane(_two_by_two(), backfill=backfill)
        recs = {j.job_id: cp.submit(j, j.arrival_s, "0" * 64) for j in _line()}
        assert cp.waiting == (["big", "strict"] if backfill else ["big", "small", "strict"])
        small = recs["small"]
        if backfill:
            assert small.state != WAITING and small.group_id == recs["a"].group_id
            assert small.explanation[0].startswith("passed the waiting line (first big, 1 waiting)")
        else:
            assert small.state == WAITING
        back = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), policy="rollmux", backfill=backfill)
        assert back.waiting == cp.waiting and back.backfill == backfill
        assert back.status(40.0)["queue"] == ("backfill" if backfill else "fifo")  # what `rollmux status` shows


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), rollout=st.integers(2, 6), train=st.integers(2, 6),
       name=st.sampled_from(["rollmux", "rollmux-regroup", "rollmux-hedge", "random"]))
def test_only_packing_jobs_ever_pass_and_the_inventory_holds(seed, rollout, train, name):
    """On random traces and clusters: every job that starts before an earlier arrival that
    was still waiting joined a running group without new nodes (it passed by packing),
    the inventory is never exceeded, and no job is lost."""
    base = Cluster()
    cluster = replace(base, rollout=replace(base.rollout, nodes=rollout), train=replace(base.train, nodes=train))
    jobs = [j for j in generate(20, seed=seed) if j.rollout_gpus <= 8 * rollout and j.train_gpus <= 8 * train]
    policy = make_policy(name, seed, cluster=cluster)
    place, passed = policy.place, set()
    gpn = cluster.gpus_per_node

    def watched(state, job, *rest):
        d = place(state, job, *rest)
        if d.placement is not None and d.placement.packs:
            passed.add(job.job_id)  # a candidate to pass, if it was behind the head
        return d

    def inventory(now, state):
        assert state.gpus_in_use("rollout") <= rollout * gpn and state.gpus_in_use("train") <= train * gpn

    policy.place = watched
    r = simulate([replace(j) for j in jobs], cluster, policy, on_change=inventory)
    assert len(r.jobs) + len(r.rejected) == len(jobs)
    by_arrival = sorted(r.jobs, key=lambda o: (o.arrival_s, o.job_id))
    for i, early in enumerate(by_arrival):
        for late in by_arrival[i + 1:]:
            if late.arrival_s > early.arrival_s and late.placed_s < early.placed_s and early.placed_s > early.arrival_s:
                assert late.job_id in passed, (late.job_id, early.job_id)
    assert r.outcomes.get("backfilled", 0) <= len(passed)
