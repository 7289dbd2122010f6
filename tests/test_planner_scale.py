"""The planner's fast path (``decide`` without ``explain``) against the plain evaluation
(``explain=True``), and the turn-class prune against the analysis it stands in for."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.accounting import ACCOUNTINGS
from rollmux.intra import MemberProfile, analyze
from rollmux.model import Cluster, Job, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, PAPER_SPACE, SLO_EPS, Planner, _slo_miss, _startup_miss, _turn_class_miss

WARM = Cluster()
FIXED = Cluster(switch_cost=SwitchCost("fixed", 3.0, 7.0))
BOUNDED = dataclasses.replace(WARM, rollout=dataclasses.replace(WARM.rollout, nodes=6),
                              train=dataclasses.replace(WARM.train, nodes=4))

_job = st.tuples(st.integers(5, 600), st.integers(5, 600), st.floats(1.0, 2.5),
                 st.sampled_from([8, 8, 8, 16]), st.sampled_from([100.0, 700.0, 1200.0]),
                 st.sampled_from([None, 3, 40, 1000]))


def _mk(i: int, spec) -> Job:
    roll, train, slo, gpus, mem, iters = spec
    return Job(f"j{i}", float(roll), float(train), gpus, gpus, mem, mem, slo, "7B", iterations=iters)


def _same(d1, d2) -> bool:
    return (d1.outcome, d1.placement, d1.marginal_cost, d1.short_pools) == \
        (d2.outcome, d2.placement, d2.marginal_cost, d2.short_pools) and \
        (d1.outcome != "wait" or d1.reason == d2.reason)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_job, st.integers(0, 9)), min_size=1, max_size=30),
       st.sampled_from(["first", "best-fit"]), st.sampled_from(["ours", "paper"]),
       st.sampled_from(["warm", "fixed", "bounded"]), st.sampled_from([PAPER_SPACE, FULL_SPACE]))
def test_fast_path_decides_as_the_plain_evaluation(arrivals, tie_break, accounting, cluster_name, space):
    cluster = {"warm": WARM, "fixed": FIXED, "bounded": BOUNDED}[cluster_name]
    planner = Planner(tie_break, ACCOUNTINGS[accounting], space=space)
    state = PlanState(cluster)
    placed: list[str] = []
    for i, (spec, leave) in enumerate(arrivals):
        j = _mk(i, spec)
        fast = planner.decide(state, j)
        plain = planner.decide(state, j, explain=True)
        assert _same(fast, plain), (fast, plain)
        if fast.placement is not None:
            state.apply(j, fast.placement)
            placed.append(j.job_id)
        if leave == 0 and placed:  # a departure now and then
            state.release(placed.pop(0))


_phase = st.tuples(st.integers(1, 400), st.integers(1, 400), st.integers(0, 2), st.integers(0, 1))


@settings(max_examples=300, deadline=None)
@given(st.lists(_phase, min_size=2, max_size=5), st.sampled_from([(0.0, 0.0), (0.9, 4.1), (3.0, 19.5)]),
       st.floats(1.0, 3.0), st.sampled_from([None, 1, 2, 5, 50]))
def test_turn_class_bound_rejects_only_what_the_analysis_rejects(phases, switch, slo, iterations):
    """Members pinned to one of three rollout nodes and one of two training nodes: the
    identically pinned ones take turns; whenever the bound fires, the steady check (or,
    with lengths, the start-up check) of the analysis fails too."""
    members = [MemberProfile(f"m{i}", float(r), float(t), (f"R{ri}",), (f"T{ti}",), *switch)
               for i, (r, t, ri, ti) in enumerate(phases)]
    jobs = [Job(m.job_id, m.t_roll, m.t_train, 8, 8, 10.0, 10.0, slo, "7B", iterations=iterations)
            for m in members]
    slos = {m.job_id: slo for m in members}
    a = analyze(members)
    steady = _slo_miss(a, slos)
    if _turn_class_miss(members, slos, None):
        assert steady
    if _turn_class_miss(members, slos, jobs):
        assert steady or _startup_miss(a, jobs)
    # the claim itself: identically pinned members have iteration >= their bound
    for m in members:
        same = [b for b in members if (b.rollout_nodes, b.train_nodes) == (m.rollout_nodes, m.train_nodes)]
        if len(same) < 2:
            continue
        trains = sum(b.t_train + b.switch_train for b in same)
        own = m.t_train + m.switch_train
        assert a.iteration_s[m.job_id] >= max(m.t_roll + m.switch_roll, trains - own) + own - 1e-4 * (1 + SLO_EPS)


def test_fast_path_on_a_builtin_trace():
    """Every arrival of the production trace: the fast and the plain path agree."""
    from rollmux.policies import make_policy
    from rollmux.sim.engine import simulate
    from rollmux.traces.builtin import load_trace

    seen = []
    for acc in ("ours", "paper"):
        policy = make_policy("rollmux", 0, accounting=ACCOUNTINGS[acc])
        planner = policy.planner
        fast_decide = planner.decide

        def checked(state, job, explain=False):
            fast = fast_decide(state, job)
            plain = fast_decide(state, job, explain=True)
            assert _same(fast, plain), (fast, plain)
            seen.append(job.job_id)
            return fast

        planner.decide = checked
        jobs, _ = load_trace("production", Cluster(), 0)
        simulate(jobs, Cluster(), policy, "worst", 0, accounting=ACCOUNTINGS[acc])
    assert len(seen) >= 400


@settings(max_examples=300, deadline=None)
@given(st.lists(_phase, min_size=1, max_size=5), st.sampled_from([(0.0, 0.0), (0.9, 4.1), (3.0, 19.5)]),
       st.floats(1.0, 3.0), st.lists(st.sampled_from([None, 1, 2, 3, 5, 50]), min_size=5, max_size=5))
def test_startup_floor_rejects_only_what_the_analysis_rejects(phases, switch, slo, lengths):
    """Whenever the floor fires, the analysis' steady or start-up check fails too, and its
    two premises hold: iterations at least solo, the period at least max(t_load, t_cycle)."""
    from rollmux.intra import t_cycle, t_load
    from rollmux.planner import _startup_floor_miss

    members = [MemberProfile(f"m{i}", float(r), float(t), (f"R{ri}",), (f"T{ti}",), *switch)
               for i, (r, t, ri, ti) in enumerate(phases)]
    jobs = [Job(m.job_id, m.t_roll, m.t_train, 8, 8, 10.0, 10.0, slo, "7B", iterations=n)
            for m, n in zip(members, lengths)]
    a = analyze(members)
    slos = {m.job_id: slo for m in members}
    if _startup_floor_miss(members, jobs):
        assert _slo_miss(a, slos) or _startup_miss(a, jobs)
    if all(v < float("inf") for v in a.iteration_s.values()):
        assert all(a.iteration_s[m.job_id] >= m.t_solo - 1e-5 for m in members)
        assert a.period >= max(t_load(members), t_cycle(members)) - 1e-5
