"""The planner's SLO check against the execution rule, from states it never analysed
(``rollmux.histories``: staggered admissions, a noisy spell, a member leaving mid-phase)."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.histories import check_planner, steady_slowdowns, stress_plan
from rollmux.intra import MemberProfile, worst_start
from rollmux.model import Cluster
from rollmux.plan_state import PlanState
from rollmux.planner import PAPER_SPACE, SLO_EPS, Planner, Space
from rollmux.traces.generate import generate
from test_intra_kernel import members

ONE_START = Space(all_starts=False)


def test_a_quiet_history_settles_where_the_analysis_says() -> None:
    """Admitted together with worst-case phases, a pair settles into the analysed schedule."""
    profiles = [MemberProfile("a", 150.0, 50.0, ("R0",), ("T0",), 1.0, 4.0),
                MemberProfile("b", 120.0, 90.0, ("R0",), ("T0",), 1.0, 4.0)]
    settled = steady_slowdowns(profiles, [0.0, 0.0], random.Random(0))
    expected = worst_start(profiles)
    for p in profiles:
        assert settled[p.job_id] == pytest.approx(expected[p.job_id] / p.t_solo, rel=1e-9)


def test_a_departure_leaves_the_rest_at_their_own_schedule() -> None:
    profiles = [MemberProfile(x, 100.0, 40.0, ("R0",), ("T0",)) for x in "abc"]
    settled = steady_slowdowns(profiles, [0.0, 10.0, 20.0], random.Random(0), leave=(1, 500.0))
    assert set(settled) == {"a", "c"}
    assert all(s == pytest.approx(200.0 / 140.0) for s in settled.values())  # two rollouts of 100 s per turn


def test_histories_break_a_check_from_one_start_and_not_the_default() -> None:
    """On these seeds the planner with a check from one start accepts three groups that
    settle above an SLO (up to 25% over) in some history. The default check, from every
    start, accepts none that do. Over more seeds the full space does miss:
    docs/placement_space.md, "SLOs in states the check never saw"."""
    seeds = range(61, 68)
    one = check_planner(ONE_START, "rollout-heavy", seeds)
    every = check_planner(PAPER_SPACE, "rollout-heavy", seeds)
    assert one.groups_missed >= 2, "the one-start check was expected to miss on these seeds"
    assert all(m.slowdown > m.slo for m in one.misses)
    assert every.misses == ()
    assert every.groups > 0 and every.histories == 6 * every.groups


@settings(max_examples=120, deadline=None)
@given(members())
def test_every_order_is_the_worst_over_explicit_reorderings(group):
    """``worst_start(orders=True)`` is each member's worst over ``worst_start`` of every
    reordering of the list (run here one by one, without the sharing of equal keys), and
    never below the admission order's own."""
    if len(group) > 4:
        group = group[:4]
    every = worst_start(group, orders=True)
    brute = {m.job_id: 0.0 for m in group}
    for order in itertools.permutations(group):
        for job_id, w in worst_start(list(order)).items():
            brute[job_id] = max(brute[job_id], w)
    one = worst_start(group)
    for m in group:
        assert every[m.job_id] == pytest.approx(brute[m.job_id], rel=1e-12, abs=1e-9)
        assert every[m.job_id] >= one[m.job_id] - 1e-9


@settings(max_examples=120, deadline=None)
@given(members(), st.floats(0.5, 2.0), st.booleans())
def test_a_limit_stops_early_only_when_some_member_is_over_it(group, factor, orders):
    """``worst_start(limit=...)``: with every member within its limit the answer is the
    full search's; with some member over it, the early answer names a member over its
    limit and no value above the full search's. So a check of "everyone within the
    limit" gives the same verdict either way."""
    if len(group) > 4:
        group = group[:4]
    full = worst_start(group, orders=orders)
    limit = {m.job_id: factor * m.t_solo for m in group}
    early = worst_start(group, orders=orders, limit=limit)
    if all(full[k] <= limit[k] for k in limit):
        assert early == full
    else:
        assert any(early[k] > limit[k] for k in limit)
        assert all(early[k] <= full[k] for k in limit)


def _plan(space: Space, seed: int, mix: str) -> PlanState:
    state, planner = PlanState(Cluster()), Planner("first", space=space)
    for job in generate(12, seed, mix=mix):
        decision = planner.decide(state, job)
        state.apply(job, decision.placement)
    return state


def test_a_group_one_order_admits_settles_above_an_slo_and_every_order_refuses_it() -> None:
    """Seed 17, mixed, the paper's space: checked in the admission order only, gen-0003 and
    gen-0008 share a group whose every start keeps their SLOs (1.138, 1.075). After a
    spell of short phases the group settles with the trainings on T4 in another cyclic
    order, at 1.245 and 1.241: the schedule that every order of the members predicts, to
    the digit. The default check (every order) keeps them apart, and its plan holds in the
    same kind of histories."""
    old = _plan(Space(all_orders=False), 17, "mixed")
    group = old.groups["g2"]
    assert [m.job.job_id for m in group.members] == ["gen-0003", "gen-0005", "gen-0006", "gen-0008"]
    profiles = [old.profile(m) for m in group.members]
    slo = {m.job.job_id: m.job.slo for m in group.members}
    one, every = worst_start(profiles), worst_start(profiles, orders=True)
    assert all(one[p.job_id] <= slo[p.job_id] * p.t_solo * (1 + SLO_EPS) for p in profiles)
    rng = random.Random(28)  # a history (found by search) with a noisy spell of 2,861 s
    span = max(p.t_roll + p.t_train for p in profiles)
    admit = sorted([0.0] + [rng.uniform(0, 1.5 * span) for _ in profiles[1:]])
    settled = steady_slowdowns(profiles, admit, rng, rng.uniform(0, 10 * span * len(profiles)))
    for job_id in ("gen-0003", "gen-0008"):
        p = next(p for p in profiles if p.job_id == job_id)
        assert settled[job_id] > slo[job_id] * 1.09
        assert settled[job_id] == pytest.approx(every[job_id] / p.t_solo, rel=1e-6)
    new = _plan(PAPER_SPACE, 17, "mixed")
    assert new.job_group["gen-0003"] != new.job_group["gen-0008"]
    assert not [m for m in stress_plan(new, 6, 17) if m.missed]


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="known gap: the default check covers the extreme starts in every order and every "
                          "departure, not a staggered join; here gen-0001 settles at 1.326 against its SLO 1.319")
def test_a_staggered_join_in_plan_order_keeps_every_slo() -> None:
    """Seed 315 of ``generate(12, mix='rollout-heavy')``, paper space: members of g0 join
    in plan order at 0, 40.9, 305.3 and 594.9 s under worst-case phases, no noise. (Expected
    to fail on the SLO only: another group is a plain failure, not this gap.)"""
    state, planner = PlanState(Cluster()), Planner("first", space=PAPER_SPACE)
    for job in generate(12, 315, mix="rollout-heavy"):
        d = planner.decide(state, job)
        if d.outcome not in ("wait", "rejected"):
            state.apply(job, d.placement)
    g = state.groups["g0"]
    members = [m.job.job_id for m in g.members]
    if members != ["gen-0000", "gen-0001", "gen-0002", "gen-0005"]:
        pytest.fail(f"the planner now forms g0 of {members}: re-derive this case")
    profiles = [state.profile(m, g.colocated) for m in g.members]
    settled = steady_slowdowns(profiles, [0.0, 40.9, 305.3, 594.9], random.Random(0))
    for m in g.members:
        assert settled[m.job.job_id] <= m.job.slo * (1 + SLO_EPS), m.job.job_id
