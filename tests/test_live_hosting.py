"""``rollmux serve --policy rollmux-host`` and ``rollmux-host-regroup``: the live control
plane hosts a job on a group's training nodes, regroups groups that host (and hosts in
them), phase for phase as the simulator does, through restores too; the hosted flag
survives snapshots and pending regroupings."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rollmux import colocation
from rollmux.model import POOLS, ROLLOUT, Cluster, Group, Job, Member, SwitchCost
from rollmux.runtime.control import LIVE_POLICIES, ControlPlane, _group_from_dict, _group_to_dict
from test_live_full_space import _trace
from test_live_moves import _live_replay, _sim_record


def _hosting_moves(phases: list, moves: list) -> tuple[int, int]:
    """(moves into a hosted place, moves out of a group that hosts) in a recorded run: a
    hosted member's rollouts run on training nodes."""
    hosted_in = {(job, gid) for job, pool, gid, nodes, _ in phases if pool == ROLLOUT and nodes[0].startswith("T")}
    hosting = {gid for _, gid in hosted_in}
    return (sum((job, to) in hosted_in for job, _, to in moves),
            sum(src in hosting for _, src, _ in moves))


@pytest.mark.parametrize("policy,seed,every", [("rollmux-host", 4, 0), ("rollmux-host", 14, 3),
                                               ("rollmux-host-regroup", 0, 0), ("rollmux-host-regroup", 11, 4)])
def test_live_hosting_is_the_simulators_phase_for_phase(policy, seed, every):
    assert policy in LIVE_POLICIES
    jobs = _trace(seed)
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    sim_phases, sim_moves, outcomes = _sim_record(jobs, cluster, 300.0, policy)
    assert outcomes["hosted"] >= 1 or policy.endswith("regroup"), "the trace must host"
    if policy.endswith("regroup"):
        into, out_of = _hosting_moves(sim_phases, sim_moves)
        assert into >= 1 and out_of >= 1, "the trace must regroup into hosting and out of a group that hosts"
    live_phases, live_moves = _live_replay(jobs, cluster, 300.0, policy, restore_every=every)
    assert sorted((j, f, t) for j, f, t, _ in live_moves) == sorted(sim_moves)
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)


def test_a_pending_regrouping_keeps_its_hosted_member_hosted():
    a = Job("a", 500.0, 100.0, 8, 8, 100.0, 100.0, 1.3, "7B")
    h = Job("h", 400.0, 50.0, 8, 8, 100.0, 100.0, 1.5, "7B", t_roll_colo_s=150.0)
    group = Group("solver", ["R1"], ["T1"], [Member(a, ("R1",), ("T1",)), Member(h, ("T1",), ("T1",), True)])
    records = {j.job_id: SimpleNamespace(job=j) for j in (a, h)}  # what the function reads of a JobRecord
    back = _group_from_dict(json.loads(json.dumps(_group_to_dict(group))), records)
    assert [m.hosted for m in back.members] == [False, True] and back.rollout_nodes == ["R1"]


def test_a_hosted_job_survives_a_restore_and_is_judged_against_its_colocated_times():
    cluster = Cluster()
    cp = ControlPlane(cluster, policy="rollmux-host")
    a = Job("a", 500.0, 100.0, 8, 8, 100.0, 100.0, 1.3, "7B", iterations=50)
    h = Job("h", 400.0, 50.0, 8, 8, 100.0, 100.0, 1.5, "7B", iterations=50, t_roll_colo_s=150.0,
            t_train_colo_s=50.0)
    cp.submit(a, 0.0, "0" * 64)
    rec = cp.submit(h, 1.0, "1" * 64)
    member = cp.plan.groups[rec.group_id].member("h")
    assert member.hosted and member.rollout_nodes == member.train_nodes
    planned = {p: sum(colocation.worst_phase(h, p, cluster, True)) for p in POOLS}
    (row,) = [j for j in cp.status(1.0)["jobs"] if j["job_id"] == "h"]
    assert row["profile_s"] == planned
    before = cp.plan.analysis(rec.group_id).iteration_s
    again = ControlPlane.restore(json.loads(json.dumps(cp.snapshot())), policy="rollmux-host")
    assert again.plan.groups[rec.group_id].member("h").hosted
    assert again.plan.analysis(rec.group_id).iteration_s == before
    assert again.plan.cost_per_hour() == cp.plan.cost_per_hour()
