"""Asynchronous members (rules 10-12 of ``rollmux.execution``): hand-computed timelines,
the executor against the analysis (``rollmux.intra_async``), and the solo math."""
from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.execution import GroupExecutor
from rollmux.intra import MemberProfile, analyze
from rollmux.kernel import TICKS_PER_S
from rollmux.intra_async import _search
from rollmux.model import ROLLOUT, TRAIN, Job

R, T = ROLLOUT, TRAIN


def drive(members: list[tuple], until: float) -> list[tuple[str, str, float, float]]:
    """Run ``GroupExecutor`` on ``members`` = (id, T_roll, T_train, rollout nodes, train
    nodes, staleness[, switch_roll, switch_train]) from 0; every phase (job, pool, start,
    end) that starts before ``until``."""
    ex = GroupExecutor()
    dur = {}
    for m in members:
        job, roll, train, rn, tn, k, *sw = m
        ex.admit(job, rn, tn, 0, *(sw or (0, 0)), staleness=k)
        dur[job] = {R: roll, T: train}
    heap: list[tuple[float, str, str]] = []
    spans = []
    now = 0
    while now < until:
        for g in ex.dispatch(now):
            end = now + g.switch_s + dur[g.job_id][g.pool]
            heapq.heappush(heap, (end, g.job_id, g.pool))
            spans.append((g.job_id, g.pool, now, end))
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, job, pool = heapq.heappop(heap)
            ex.finish(job, now, pool=pool)
    return sorted(s for s in spans if s[2] < until)


def _sorted(spans):
    return sorted(spans)


def test_async_alone_rollout_bound_k1_runs_rollouts_back_to_back():
    # R = 10 >= T = 4, k = 1: rollout i+1 may start once training i-1 ended (r - t <= 1).
    got = drive([("A", 10, 4, ("R0",), ("T0",), 1)], 40)
    assert got == _sorted([("A", R, 0, 10), ("A", R, 10, 20), ("A", T, 10, 14), ("A", R, 20, 30),
                           ("A", T, 20, 24), ("A", R, 30, 40), ("A", T, 30, 34)])


def test_async_alone_training_bound_k1_waits_one_version():
    # R = 4 < T = 10, k = 1: rollout 3 waits for training 1 (ends 14), rollout 4 for training 2.
    got = drive([("A", 4, 10, ("R0",), ("T0",), 1)], 34)
    assert got == _sorted([("A", R, 0, 4), ("A", R, 4, 8), ("A", T, 4, 14), ("A", R, 14, 18),
                           ("A", T, 14, 24), ("A", R, 24, 28), ("A", T, 24, 34)])


def test_async_alone_training_bound_k2_runs_one_rollout_further_ahead():
    # k = 2: rollout 3 starts at 8 (r - t = 2 - 0), rollout 4 waits for training 1 (14).
    got = drive([("A", 4, 10, ("R0",), ("T0",), 2)], 34)
    assert got == _sorted([("A", R, 0, 4), ("A", R, 4, 8), ("A", T, 4, 14), ("A", R, 8, 12),
                           ("A", R, 14, 18), ("A", T, 14, 24), ("A", R, 24, 28), ("A", T, 24, 34)])


@pytest.mark.parametrize("roll,train", [(10, 4), (4, 10), (7, 7)])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_async_alone_period_is_the_longer_phase(roll, train, k):
    a = analyze([MemberProfile("A", roll, train, ("R0",), ("T0",), staleness=k)])
    assert a.period == max(roll, train) and a.iteration_s["A"] == max(roll, train) and a.slowdown["A"] == 1.0
    job = Job("A", roll, train, staleness=k, iterations=25)
    assert job.t_solo == max(roll, train) and job.solo_run_s(25) == 25 * max(roll, train) + min(roll, train)
    ends = [e for j, p, s, e in drive([("A", roll, train, ("R0",), ("T0",), k)], 30 * (roll + train)) if p == T]
    assert ends[24] == job.solo_run_s(25)  # n iterations alone: n max(R, T) + min(R, T)


def test_staleness_zero_alone_alternates():
    got = drive([("A", 10, 4, ("R0",), ("T0",), 0)], 28)
    assert got == _sorted([("A", R, 0, 10), ("A", T, 10, 14), ("A", R, 14, 24), ("A", T, 24, 28)])
    assert Job("A", 10, 4).t_solo == 14 and Job("A", 10, 4).solo_run_s(3) == 42


def test_async_and_sync_sharing_the_training_node():
    """A: async k=1, R=10 on R0, T=4 on T0. B: sync, R=3 on R1, T=5 on T0 (shared).

    t=0  A rollout [0,10], B rollout [0,3]     t=3  B train [3,8]        t=8  B rollout [8,11]
    t=10 A: rollout 1 done, f=1 > t=0 -> train queued; r - t = 1 <= 1 -> rollout queued:
         A rollout [10,20], A train [10,14]     t=11 B train queued, T0 busy until 14
    t=14 B train [14,19]   t=19 B rollout [19,22]   t=20 A rollout [20,30], A train [20,24]
    t=22 B train queued    t=24 B train [24,29]     t=29 B rollout [29,32]  t=30 A [30,40] / [30,34]
    Steady: period 10; A iterates every 10 (slowdown 10 / max(10, 4) = 1), B every 10
    (slowdown 10 / 8 = 1.25).
    """
    members = [("A", 10, 4, ("R0",), ("T0",), 1), ("B", 3, 5, ("R1",), ("T0",), 0)]
    assert drive(members, 34) == _sorted([
        ("A", R, 0, 10), ("B", R, 0, 3), ("B", T, 3, 8), ("B", R, 8, 11), ("A", R, 10, 20), ("A", T, 10, 14),
        ("B", T, 14, 19), ("B", R, 19, 22), ("A", R, 20, 30), ("A", T, 20, 24), ("B", T, 24, 29),
        ("B", R, 29, 32), ("A", R, 30, 40), ("A", T, 30, 34)])
    a = analyze([MemberProfile(*m[:5], staleness=m[5]) for m in members])
    assert a.period == 10 and a.iteration_s == {"A": 10, "B": 10}
    assert a.slowdown == {"A": 1.0, "B": 1.25}


def test_colocated_async_member_never_overlaps_its_own_phases():
    # One node N0 in both pools, R=4, T=10, k=1: rollout 2 goes first (rollout queue first), then
    # they alternate; the period is R + T = 14.
    got = drive([("A", 4, 10, ("N0",), ("N0",), 1)], 46)
    assert got == _sorted([("A", R, 0, 4), ("A", R, 4, 8), ("A", T, 8, 18), ("A", R, 18, 22),
                           ("A", T, 22, 32), ("A", R, 32, 36), ("A", T, 36, 46)])
    a = analyze([MemberProfile("A", 4, 10, ("N0",), ("N0",), staleness=1)])
    assert a.period == 14 and a.slowdown["A"] == 14 / 10


def test_rollout_bound_and_finish_contract():
    ex = GroupExecutor()
    ex.admit("A", ("R0",), ("T0",), 0, staleness=1, rollouts=2)
    assert [g.pool for g in ex.dispatch(0)] == [R]
    ex.finish("A", 10)
    assert sorted(g.pool for g in ex.dispatch(10)) == [R, T]
    assert ex.running_pools("A") == (R, T) and ex.running("A") is None and ex.pipeline("A") == (2, 1, 0)
    with pytest.raises(ValueError, match="not running a single phase"):
        ex.finish("A", 12)
    ex.finish("A", 14, pool=T)
    ex.finish("A", 20, pool=R)
    assert [g.pool for g in ex.dispatch(20)] == [T]  # no third rollout: its bound is 2
    ex.finish("A", 24)
    assert ex.dispatch(24) == [] and ex.pipeline("A") == (2, 2, 2)
    assert ex.tail("A", 24, 1) == 0  # rule 12


def test_same_instant_ends_apply_in_any_order():
    def run(order):
        ex = GroupExecutor()
        ex.admit("A", ("R0",), ("T0",), 0, staleness=1)
        ex.dispatch(0)  # A rollout [0,5]
        ex.finish("A", 5)
        assert sorted(g.pool for g in ex.dispatch(5)) == [R, T]  # A rollout 2 and training 1, both to 10
        for pool in order:
            ex.finish("A", 10, pool=pool)
        return ex.queue_entries(R), ex.queue_entries(T), ex.pipeline("A")
    assert run((R, T)) == run((T, R)) == ([(10, 0, "A")], [(10, 0, "A")], (2, 2, 1))


_member = st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(0, 1), st.integers(0, 1),
                    st.sampled_from([0, 0, 1, 2]), st.sampled_from([0, 1]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_member, min_size=1, max_size=4))
def test_analysis_window_is_what_the_executor_runs(spec):
    """The base run's period window (all admitted at 0), shifted to its start t0 and one
    period later, is exactly the executor's schedule there (integer seconds: no
    rounding); the analysis reports no member faster than in that orbit."""
    members = [(str(i), r, t, (f"R{rn}",), (f"T{tn}",), k, sw, sw) for i, (r, t, rn, tn, k, sw) in enumerate(spec)]
    if not any(m[5] for m in members):
        members[0] = (*members[0][:5], 1, *members[0][6:])
    key = tuple((m[1], m[2], tuple(int(x[1:]) for x in m[3]), tuple(10 + int(x[1:]) for x in m[4]), m[6], m[7], m[5])
                for m in members)
    orbit = _search(key, (0,) * len(key))
    base = orbit.shape
    if ("fallback", orbit.admits) not in orbit.states:  # a repeat was found: the window is a period
        t0, period = base.t0 / TICKS_PER_S, base.period
        window = sorted((str(i), p, s / TICKS_PER_S - t0, e / TICKS_PER_S - t0) for i, p, _, s, _, e in base.window)
        got = drive(members, t0 + 2 * period)
        for shift in (t0, t0 + period):
            part = sorted((j, p, s - shift, e - shift) for j, p, s, e in got if shift <= s < shift + period)
            assert part == window
    a = analyze([MemberProfile(m[0], m[1], m[2], m[3], m[4], m[6], m[7], m[5]) for m in members])
    assert all(a.iteration_s[str(i)] >= it for i, it in enumerate(base.iteration_s))


def test_analysis_finds_the_orbit_a_late_admission_falls_into():
    """Found on a generated trace (docs/rollart.md): B joining A mid-run mostly falls into
    an orbit where A trains twice per B iteration (951 s). Admitted together they reach
    547.6 s each; the analysis reports B's 951 s, so the planner refuses the pair."""
    a_ = MemberProfile("A", 144.6, 422.2, ("R0", "R1"), ("T0", "T1"), 1.7, 5.9, 1)
    b_ = MemberProfile("B", 399.5, 96.0, ("R0",), ("T0",), 1.8, 4.7, 0)
    key = tuple((m.t_roll, m.t_train, (0, 1)[:len(m.rollout_nodes)], (2, 3)[:len(m.train_nodes)],
                 m.switch_roll, m.switch_train, m.staleness) for m in (a_, b_))
    assert _search(key, (0, 0)).shape.iteration_s == (547.6, 547.6)
    a = analyze([a_, b_])
    assert a.iteration_s == {"A": 547.6, "B": 951.0} and a.period == 951.0
