"""``rollmux serve --policy rollmux-full``: the live control plane in the placement space
beyond the paper (training scaling, both-sides scaling, co-location) decides and runs
every phase as the simulator does, through restores too, and judges a co-located
phase against its co-located time."""
from __future__ import annotations

import json

import pytest

from rollmux import colocation
from rollmux.model import POOLS, ROLLOUT, Cluster, Job, PoolSpec, SwitchCost
from rollmux.runtime.control import LIVE_POLICIES, ControlPlane
from rollmux.traces.generate import generate
from test_live_moves import _live_replay, _sim_record


@pytest.mark.parametrize("seed,every", [(0, 0), (1, 0), (11, 4)])
def test_live_full_space_is_the_simulators_phase_for_phase(seed, every):
    jobs = generate(14, seed=seed, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    for j in jobs:
        j.iterations, j.duration_s = j.solo_iterations(), None
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    sim_phases, _, outcomes = _sim_record(jobs, cluster, 300.0, "rollmux-full")
    assert outcomes["co-located"] >= 1 and outcomes["scaled-train"] >= 1, "the trace must use the full space"
    live_phases, moves = _live_replay(jobs, cluster, 300.0, "rollmux-full", restore_every=every)
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key) and moves == []


def test_a_colocated_phase_is_judged_against_its_colocated_time():
    """Co-located, job c's rollout runs on H800s: 100 s x 4.0 / 3.35 plus a warm switch,
    longer than its 100 s H20 profile by more than 10%. That is its planned time, not an
    overrun; 20% past it is."""
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, 2048.0), train=PoolSpec("H800", 5.28, 2048.0))
    assert "rollmux-full" in LIVE_POLICIES
    cp = ControlPlane(cluster, policy="rollmux-full")
    job = Job("c", 100.0, 300.0, 8, 8, 100.0, 100.0, slo=1.3, model="7B", iterations=3)
    rec = cp.submit(job, 0.0, "0" * 64)
    assert cp.plan.groups[rec.group_id].colocated
    planned = {p: sum(colocation.worst_phase(job, p, cluster, True)) for p in POOLS}
    assert planned[ROLLOUT] > 1.1 * job.t_roll_s
    (row,) = [j for j in cp.status(0.0)["jobs"] if j["job_id"] == "c"]
    assert row["profile_s"] == planned
    grant = cp.acquire("c", ROLLOUT)
    cp.release("c", ROLLOUT, grant.seq, planned[ROLLOUT], planned[ROLLOUT])
    assert cp.record("c").over_profile == 0
    now = planned[ROLLOUT]
    grant = cp.acquire("c", "train")
    cp.release("c", "train", grant.seq, 1.2 * planned["train"], now + 1.2 * planned["train"])
    assert cp.record("c").over_profile == 1
    again = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), policy="rollmux-full")
    assert again.plan.groups[rec.group_id].colocated and again.record("c").over_profile == 1
