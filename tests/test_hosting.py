"""Hosting (``Space.hosting``, policy ``rollmux-host``): a job co-located on a shared group's
training nodes. The planner offers it, the plan state and the simulator run it as the
analysis does, the guard keeps gangs off hosted nodes, and moves leave it alone."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux import colocation
from rollmux.intra import MemberProfile, analyze
from rollmux.model import TRAIN, Cluster, Job
from rollmux.plan_state import PlanState
from rollmux.planner import (FULL_SPACE, HOSTING_SPACE, Planner, _least_iteration, _slo_miss,
                             _startup_floor_miss, _startup_miss)
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate

CLUSTER = Cluster()


def _pair(iterations: int = 200) -> tuple[Job, Job]:
    """a keeps its rollout node busy; h's rollout is long on the rollout type but short
    co-located, so packing h onto a's rollout node breaks a's SLO and hosting does not."""
    a = Job("a", 500.0, 100.0, 8, 8, 100.0, 100.0, 1.3, "7B", iterations=iterations)
    h = Job("h", 400.0, 50.0, 8, 8, 100.0, 100.0, 1.5, "7B", iterations=iterations, arrival_s=1000.0,
            t_roll_colo_s=150.0, t_train_colo_s=50.0)
    return a, h


def test_hosting_is_chosen_where_packing_breaks_an_slo():
    a, h = _pair()
    state, planner = PlanState(CLUSTER), Planner(space=HOSTING_SPACE)
    state.apply(a, planner.decide(state, a).placement)
    d = planner.decide(state, h, explain=True)
    kinds = {c.kind: c for c in d.candidates}
    assert kinds["pack"].verdict == "rejected" and "SLO" in kinds["pack"].reason
    assert d.outcome == "hosted" and d.marginal_cost == 0.0
    assert d.placement.rollout_nodes == d.placement.train_nodes == tuple(state.groups["g0"].train_nodes)
    assert planner.decide(state, h).placement == d.placement  # the fast path agrees
    # in the paper's space the same job scales the rollout side instead
    assert Planner().decide(state, h).outcome == "scaled"

    state.apply(h, d.placement)
    member = state.group_of("h").member("h")
    assert member.hosted
    # the training node holds a's training state and both of h's
    entry = state.view("g0").nodes[TRAIN][0]
    assert entry.used_gb == a.mem_train_gb + colocation.node_mem_gb(h)
    # the analysis runs h's co-located phases, with its disaggregated solo time as SLO basis
    prof = state.profile(member)
    assert prof.t_roll == pytest.approx(150.0 + CLUSTER.switch_cost.seconds("7B", "rollout"))
    assert prof.t_solo == h.t_solo
    an = state.analysis("g0")
    assert an.slowdown["h"] == pytest.approx(an.iteration_s["h"] / h.t_solo)
    assert an.slowdown["a"] <= a.slo


def test_simulator_runs_a_hosted_member_as_analysed():
    """Replayed, each job's mean iteration is its analysed steady iteration within one
    period of start-up per run; h's phases are billed to the training pool."""
    a, h = _pair(iterations=300)
    state, planner = PlanState(CLUSTER), Planner(space=HOSTING_SPACE)
    state.apply(a, planner.decide(state, a).placement)
    state.apply(h, planner.decide(state, h).placement)
    an = state.analysis("g0")
    result = simulate([a, h], CLUSTER, make_policy("rollmux-host"), record_spans=True)
    assert result.outcomes["hosted"] == 1
    by = {j.job_id: j for j in result.jobs}
    # a runs alone until h arrives (1000 s of its 300 x 600 s), then at the analysed pace
    for job in (a, h):
        measured = by[job.job_id].slowdown
        assert measured <= an.slowdown[job.job_id] + an.period / (300 * job.t_solo) + 1e-6
        assert measured >= (1.0 if job is a else 0.99 * an.slowdown["h"]) - 1e-6
    assert all(j.slo_met for j in result.jobs)
    h_spans = [s for s in result.spans if s[1] == "h"]
    assert h_spans and all(s[3] == ("T0",) for s in h_spans)
    busy = {p: result.utilization[p] * result.gpu_seconds[p] for p in ("rollout", "train")}
    assert busy["rollout"] == pytest.approx(300 * 500.0 * 8, rel=1e-6)  # only a's rollouts
    assert busy["train"] == pytest.approx(300 * (100.0 + 150.0 + 50.0) * 8, rel=1e-6)  # a's trainings, h's phases


def test_a_gang_across_a_hosted_node_is_refused():
    """A two-node trainer may not join where a one-node job is hosted on one of its
    training nodes, nor may a job be hosted on one node of a two-node trainer's."""
    wide = Job("w", 300.0, 200.0, 16, 16, 100.0, 100.0, 2.0, "7B", iterations=500)
    small = Job("s", 300.0, 60.0, 8, 8, 100.0, 100.0, 2.0, "7B", iterations=500,
                t_roll_colo_s=60.0, t_train_colo_s=40.0)
    state, planner = PlanState(CLUSTER), Planner(space=HOSTING_SPACE)
    state.apply(wide, planner.decide(state, wide).placement)
    d = planner.decide(state, small, explain=True)
    hosts = [c for c in d.candidates if c.kind == "host"]
    assert hosts and all(c.verdict == "rejected" and "hosting:" in c.reason for c in hosts)
    assert d.outcome != "hosted"


def test_moves_leave_a_hosted_member_where_it_is():
    a, h = _pair()
    state, planner = PlanState(CLUSTER), Planner(space=HOSTING_SPACE)
    state.apply(a, planner.decide(state, a).placement)
    state.apply(h, planner.decide(state, h).placement)
    # a lone job elsewhere with room for h: repack still does not move h
    other = Job("o", 50.0, 50.0, 8, 8, 100.0, 100.0, 3.0, "7B", iterations=10)
    state.apply(other, Planner().decide(state, other).placement)
    assert planner.repack(state, "h", 10, 1e9) is None
    from rollmux.improve import improve, plan_regroup
    assert plan_regroup(state, "g0", lambda k: (10, 1e9), lambda k: 0.0) is None
    improve(state)
    assert state.job_group["h"] == "g0" and state.group_of("h").member("h").hosted


_hphase = st.tuples(st.integers(1, 400), st.integers(1, 400), st.integers(0, 2), st.integers(0, 1), st.booleans(),
                    st.sampled_from([0.5, 1.0, 1.6]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_hphase, min_size=1, max_size=5), st.floats(1.0, 3.0),
       st.lists(st.sampled_from([None, 1, 2, 3, 5, 50]), min_size=5, max_size=5))
def test_startup_floor_with_hosted_members_rejects_only_what_the_analysis_rejects(phases, slo, lengths):
    """Hosted members (both phases on one training node, an SLO basis that may be above or
    below their phases' sum): the floor fires only where the analysis rejects, and its
    premise holds, each iteration at least ``_least_iteration``."""
    members, jobs = [], []
    for i, ((r, t, ri, ti, hosted, basis), n) in enumerate(zip(phases, lengths)):
        job = Job(f"m{i}", float(r) * (basis if hosted else 1.0), float(t), 8, 8, 10.0, 10.0, slo, "7B",
                  iterations=n)
        nodes = ((f"T{ti}",), (f"T{ti}",)) if hosted else ((f"R{ri}",), (f"T{ti}",))
        members.append(MemberProfile(job.job_id, float(r), float(t), *nodes, 0.0 if hosted else 0.9,
                                     0.0 if hosted else 4.1, 0, job.t_solo if hosted else None))
        jobs.append(job)
    a = analyze(members)
    slos = {m.job_id: slo for m in members}
    if _startup_floor_miss(members, jobs):
        assert _slo_miss(a, slos) or _startup_miss(a, jobs)
    if all(v < float("inf") for v in a.iteration_s.values()):
        for job, m in zip(jobs, members):
            assert a.iteration_s[m.job_id] >= _least_iteration(job, m) - 1e-5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(20, 600), st.integers(20, 600), st.floats(1.0, 2.5), st.sampled_from([8, 16]),
                          st.sampled_from([0.5, 1.0, 1.3]), st.integers(0, 6)), min_size=1, max_size=20),
       st.sampled_from([HOSTING_SPACE, dataclasses.replace(FULL_SPACE, hosting=True)]))
def test_fast_path_decides_as_the_plain_evaluation_with_hosting(arrivals, space):
    planner = Planner(space=space)
    state = PlanState(CLUSTER)
    placed: list[str] = []
    for i, (roll, train, slo, gpus, colo, leave) in enumerate(arrivals):
        j = Job(f"j{i}", float(roll), float(train), gpus, gpus, 100.0, 100.0, slo, "7B", iterations=200,
                t_roll_colo_s=roll * colo, t_train_colo_s=float(train))
        fast = planner.decide(state, j)
        plain = planner.decide(state, j, explain=True)
        assert (fast.outcome, fast.placement, fast.marginal_cost) == (plain.outcome, plain.placement,
                                                                      plain.marginal_cost)
        if fast.placement is not None:
            state.apply(j, fast.placement)
            placed.append(j.job_id)
        if leave == 0 and placed:
            state.release(placed.pop(0))
