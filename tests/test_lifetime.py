"""The lifetime objective (``rollmux.lifetime``): L(p) = C(G') T(G') - C(G) T(G), checked
by hand on small groups; the planner's choice by it against the rate rule; the
simulator's fast-forward and the live plane deciding exactly as the event-by-event
simulator does."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.intra import analyze
from rollmux.lifetime import lifetime_cost
from rollmux.model import ROLLOUT, TRAIN, Cluster, Job, Member, SwitchCost
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import FULL_SPACE, Planner
from rollmux.policies import make_policy
from rollmux.runtime.control import LIVE_POLICIES, ControlPlane
from rollmux.sim.engine import simulate
from test_live_full_space import _trace
from test_live_moves import _live_replay, _sim_record

CLUSTER = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
PRICE = {p: CLUSTER.node_price(p) for p in (ROLLOUT, TRAIN)}


def _one_group(first: Job) -> PlanState:
    state = PlanState(CLUSTER)
    state.apply(first, Placement(None, ("R0",), ("T0",), ("R0",), ("T0",)))
    return state


def test_a_new_group_costs_its_nodes_for_the_jobs_whole_run():
    job = Job("j", 300.0, 100.0, slo=1.5)
    state = PlanState(CLUSTER)
    placement = Placement(None, ("R0",), ("T0",), ("R0",), ("T0",))
    assert lifetime_cost(state, job, placement, 40, lambda k: None) == pytest.approx(
        (PRICE[ROLLOUT] + PRICE[TRAIN]) * 40 * 400.0 / 3600)


def test_packing_pays_the_members_slowdown_and_the_newcomers_stay_alone():
    a = Job("a", 300.0, 100.0, slo=2.0)
    j = Job("j", 100.0, 300.0, slo=2.0)
    state = _one_group(a)
    pack = Placement("g0", ("R0",), ("T0",))
    before = analyze([state.view("g0").profiles[0]]).iteration_s
    after = analyze([*state.view("g0").profiles, state.profile(Member(j, ("R0",), ("T0",)))]).iteration_s
    rate = PRICE[ROLLOUT] + PRICE[TRAIN]
    for r_a, r_j in ((100, 10), (10, 100), (50, 50)):
        expected = rate * (max(r_a * after["a"], r_j * after["j"]) - r_a * before["a"]) / 3600
        assert lifetime_cost(state, j, pack, r_j, {"a": r_a}.get) == pytest.approx(expected)
    assert lifetime_cost(state, j, pack, 10, lambda k: None) == float("inf")  # a member of unknown length


@settings(max_examples=60, deadline=None)
@given(st.integers(50, 600), st.integers(50, 600), st.integers(50, 600), st.integers(50, 600),
       st.integers(1, 300), st.integers(1, 300))
def test_the_lifetime_choice_is_the_least_l_among_the_rate_rules_feasible_candidates(ra, ta, rj, tj, left_a, left_j):
    """Brute force: evaluate every candidate the planner lists as feasible by hand."""
    a = Job("a", float(ra), float(ta), slo=1.8)
    j = Job("j", float(rj), float(tj), slo=1.6)
    state = _one_group(a)
    remaining = {"a": left_a, "j": left_j}.get
    explained = Planner(space=FULL_SPACE).decide(state, j, explain=True)
    feasible = [c for c in explained.candidates if c.verdict in ("feasible", "chosen")]
    chosen = Planner(space=FULL_SPACE, objective="lifetime").decide(state, j, remaining=remaining)
    costs = [lifetime_cost(state, j, c.placement, left_j, remaining) for c in feasible]
    assert chosen.placement == feasible[costs.index(min(costs))].placement
    assert [c.verdict for c in chosen.candidates].count("chosen") == 1


def test_a_short_newcomer_opens_its_own_group_rather_than_slow_a_long_member():
    """The rate rule packs (no new node); two rollout-heavy jobs take turns on the rollout
    node, and packing would slow the long-running member for its remaining 1,000
    iterations, which costs more than the newcomer's own group for its 10."""
    a = Job("a", 400.0, 100.0, slo=2.0)
    j = Job("j", 400.0, 100.0, slo=2.0)
    state = _one_group(a)
    rate = Planner().decide(state, j)
    assert rate.outcome == "packed"
    life = Planner(objective="lifetime").decide(state, j, remaining={"a": 1000, "j": 10}.get)
    assert life.outcome == "new-group"
    assert "lifetime $" in next(c for c in life.candidates if c.verdict == "chosen").reason
    # both with 10 left: a rollout node of its own for 10 iterations (H20's $/h x 10 x 500 s)
    # is cheaper than slowing both for 10 (the pair's $/h x 10 x 300 s more) or a group of its own
    short = Planner(objective="lifetime").decide(state, j, remaining={"a": 10, "j": 10}.get)
    assert short.outcome == "scaled"
    assert lifetime_cost(state, j, short.placement, 10, {"a": 10}.get) == pytest.approx(PRICE[ROLLOUT] * 10 * 500 / 3600)


def test_without_lengths_the_lifetime_planner_decides_by_rate():
    a = Job("a", 400.0, 100.0, slo=2.0)
    j = Job("j", 400.0, 100.0, slo=2.0)
    state = _one_group(a)
    rate = Planner().decide(state, j)
    life = Planner(objective="lifetime")
    assert life.decide(state, j).placement == rate.placement  # no remaining given
    assert life.decide(state, j, remaining={"a": 1000}.get).placement == rate.placement  # its own length unknown
    with pytest.raises(ValueError, match="objective"):
        Planner(objective="fastest")


@pytest.mark.parametrize("trace", ["production", "philly-mix"])
def test_fast_forward_decides_as_the_event_by_event_run(trace):
    from rollmux.traces.builtin import load_trace

    jobs, _ = load_trace(trace, Cluster())
    jobs = sorted(jobs, key=lambda x: x.arrival_s)[:80]
    for name in ("rollmux-lifetime", "rollmux-full-lifetime"):
        fast = simulate(jobs, Cluster(), make_policy(name))
        slow = simulate(jobs, Cluster(), make_policy(name), fast_forward=False)
        assert fast.total_cost == pytest.approx(slow.total_cost, rel=1e-12) and fast.outcomes == slow.outcomes
        assert sorted((o.job_id, round(o.slowdown, 9)) for o in fast.jobs) == sorted(
            (o.job_id, round(o.slowdown, 9)) for o in slow.jobs)


@pytest.mark.parametrize("policy,seed,every", [("rollmux-lifetime", 0, 0), ("rollmux-lifetime", 3, 4),
                                               ("rollmux-full-lifetime", 1, 0), ("rollmux-full-lifetime", 11, 5)])
def test_the_live_plane_places_by_lifetime_as_the_simulator(policy, seed, every):
    assert policy in LIVE_POLICIES
    jobs = _trace(seed)
    sim_phases, _, outcomes = _sim_record(jobs, CLUSTER, 300.0, policy)
    rate = simulate(jobs, CLUSTER, make_policy("rollmux-full" if "full" in policy else "rollmux"), record_spans=True)
    first = lambda spans: {job: gid for gid, job, *_ in sorted(spans, key=lambda s: -s[4])}  # noqa: E731
    assert first(rate.spans) != {job: gid for job, _, gid, _, _ in sorted(sim_phases, key=lambda p: -p[4])}, \
        "the trace must place some job differently from the rate rule"
    live_phases, live_moves = _live_replay(jobs, CLUSTER, 300.0, policy, restore_every=every)
    assert live_moves == []
    key = lambda p: (p[4], p[0], p[1])  # noqa: E731
    assert sorted(live_phases, key=key) == sorted(sim_phases, key=key)


def test_a_live_job_without_a_set_count_is_placed_by_rate():
    cp = ControlPlane(CLUSTER, policy="rollmux-lifetime")
    ref = ControlPlane(CLUSTER, policy="rollmux")
    for plane in (cp, ref):
        plane.submit(Job("a", 400.0, 100.0, slo=3.0, iterations=1000), 0.0, "0" * 64)
        plane.submit(Job("j", 400.0, 100.0, slo=3.0), 1.0, "0" * 64)  # open-ended
    assert cp.record("j").outcome == ref.record("j").outcome == "packed"
    cp.submit(Job("k", 400.0, 100.0, slo=3.0, iterations=10), 2.0, "0" * 64)
    assert cp.record("k").outcome == "new-group"  # j's group has a member of unknown length
