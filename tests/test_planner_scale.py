"""The planner's fast path (``decide`` without ``explain``) against the plain evaluation
(``explain=True``), and the peer prune against the analysis it stands in for."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.accounting import ACCOUNTINGS
from rollmux.intra import MemberProfile, analyze, sync_key
from rollmux.kernel import _simulated, peer_floors
from rollmux.model import Cluster, Job, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, PAPER_SPACE, Planner, _peer_miss, _slo_miss, _startup_miss

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


_pins = st.sampled_from([("R0",), ("R1",), ("R2",), ("R0", "R1"), ("R1", "R2")])
_tpins = st.sampled_from([("T0",), ("T1",), ("T0", "T1"), ("T1", "T2")])
_member = st.tuples(st.integers(1, 400), st.integers(1, 400), _pins, _tpins)


@settings(max_examples=400, deadline=None)
@given(st.lists(_member, min_size=2, max_size=5), st.sampled_from([(0.0, 0.0), (0.9, 4.1), (3.0, 19.5)]),
       st.floats(1.0, 3.0), st.sampled_from([None, 1, 2, 5, 50]))
def test_peer_bound_rejects_only_what_the_analysis_rejects(members, switch, slo, iterations):
    """Members on one or two of three nodes per pool: whenever ``_peer_miss`` fires, the
    steady check (or, with lengths, the start-up check) of the analysis fails too; and the
    claims behind it hold from every start (each member ready for rollout or training):
    a member with a peer iterates at least its component floor, the period (when the
    member is served) is at least its gap floor, and that is at least the old
    turn-class bound (identically pinned members)."""
    profiles = [MemberProfile(f"m{i}", float(r), float(t), rn, tn, *switch)
                for i, (r, t, rn, tn) in enumerate(members)]
    jobs = [Job(m.job_id, m.t_roll, m.t_train, 8, 8, 10.0, 10.0, slo, "7B", iterations=iterations)
            for m in profiles]
    slos = {m.job_id: slo for m in profiles}
    a = analyze(profiles)
    if _peer_miss(profiles, slos, None):
        assert _slo_miss(a, slos)
    if _peer_miss(profiles, slos, jobs):
        assert _slo_miss(a, slos) or _startup_miss(a, jobs)
    key = sync_key(profiles)
    floors = peer_floors(key)
    tol = 1e-4
    for m, f in zip(profiles, floors):
        same = [b for b in profiles if (b.rollout_nodes, b.train_nodes) == (m.rollout_nodes, m.train_nodes)]
        if len(same) >= 2:
            trains = sum(b.t_train + b.switch_train for b in same)
            own = m.t_train + m.switch_train
            assert f is not None and f[0] >= max(m.t_roll + m.switch_roll, trains - own) + own - 1e-9
    if not any(floors):
        return
    for start in range(1 << len(profiles)):
        shape = _simulated(key, start)
        for i, f in enumerate(floors):
            if f is not None:
                assert f[0] <= f[1] + 1e-9
                assert shape.iteration_s[i] >= f[1] - tol, (start, i, shape.iteration_s, floors)
                if shape.iteration_s[i] < float("inf"):  # two training ends of i in the window
                    assert shape.period >= f[0] - tol


def test_a_run_without_a_repeat_is_raised_to_its_component_floor():
    """Five members (from a synthetic workload) whose run never repeats within the
    analysis' limit: the second-half estimate of m0 (431.577 s) lies below the floor of
    its component {m0, m4} (rollout node R1: 277.4 + 1.7 + 150.8 + 1.8 = 431.7 s), which
    every periodic schedule obeys; the analysis reports the floor, so ``_peer_miss``
    agrees with it, while m4, measured above the floor, keeps its estimate."""
    spec = [(277.4, 53.0, ("R1", "R2"), ("T1", "T2"), 1.7, 5.9), (312.7, 61.9, ("R3",), ("T1",), 1.8, 4.7),
            (355.7, 76.1, ("R5",), ("T2",), 1.8, 4.7), (80.5, 79.9, ("R15",), ("T1",), 1.8, 4.7),
            (150.8, 110.9, ("R1",), ("T2",), 1.8, 4.7)]
    profiles = [MemberProfile(f"m{i}", *row) for i, row in enumerate(spec)]
    floors = peer_floors(sync_key(profiles))
    assert floors[0][1] == floors[4][1] and abs(floors[0][1] - 431.7) < 1e-9
    assert floors[1] is floors[2] is floors[3] is None
    a = analyze(profiles)
    assert a.period > 60 * 431.7 / 2  # the second half of a run of 60 iterations: no repeat
    assert a.iteration_s["m0"] == floors[0][1]
    assert a.iteration_s["m4"] > floors[4][1] + 1.0
    tight = {"m0": 431.0 / profiles[0].t_solo, **{m.job_id: 10.0 for m in profiles[1:]}}
    assert _peer_miss(profiles, tight, None) and _slo_miss(a, tight)


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
