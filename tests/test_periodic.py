"""The simulator's fast-forward (rollmux.sim.periodic) gives the event-by-event results."""
import pytest

from rollmux.accounting import ACCOUNTINGS
from rollmux.cluster_file import cluster_from_dict
from rollmux.model import Cluster, Job
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.sim.periodic import Cycle
from rollmux.traces.builtin import load_trace

REL = 1e-9


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(1.0, abs(a), abs(b))


def assert_same(slow, fast) -> None:
    """Same jobs, groups, outcomes and iterations; times, cost and busy time to rounding."""
    assert [o.job_id for o in slow.jobs] == [o.job_id for o in fast.jobs]
    for a, b in zip(slow.jobs, fast.jobs):
        assert (a.group_id, a.outcome, a.iterations, a.slo_met) == \
               (b.group_id, b.outcome, b.iterations, b.slo_met), a.job_id
        assert _close(a.placed_s, b.placed_s) and _close(a.end_s, b.end_s), (a.job_id, a.end_s, b.end_s)
        if a.last_iteration_s is not None:
            assert _close(a.last_iteration_s, b.last_iteration_s), a.job_id
    assert slow.rejected == fast.rejected
    assert _close(slow.total_cost, fast.total_cost)
    for pool in ("rollout", "train"):
        if slow.bubble(pool) is not None:
            assert abs(slow.bubble(pool) - fast.bubble(pool)) < 1e-9
    assert slow.outcomes == fast.outcomes


def _builtin_cases() -> list:
    """Every policy on both accountings of production; on philly-mix the planner's two
    policies, and the baselines (the same skip on simpler groups) only under ``-m slow``."""
    cases = []
    for trace in ("production", "philly-mix"):
        for accounting in ("ours", "paper"):
            for policy in ("rollmux", "rollmux-bestfit", "solo-d", "colocated", "gavel", "most-idle"):
                slow = trace == "philly-mix" and not policy.startswith("rollmux")
                cases.append(pytest.param(trace, accounting, policy, marks=[pytest.mark.slow] if slow else [],
                                          id=f"{policy}-{accounting}-{trace}"))
    return cases


@pytest.mark.parametrize("trace, accounting, policy", _builtin_cases())
def test_builtin_traces_same_results(trace, accounting, policy):
    acct = ACCOUNTINGS[accounting]
    cluster = acct.apply_cluster(Cluster())
    jobs, _ = load_trace(trace, cluster, 0)
    runs = [simulate(jobs, cluster, make_policy(policy, 0, acct), "worst", 0, accounting=acct, fast_forward=ff)
            for ff in (False, True)]
    assert_same(*runs)
    assert runs[1].events < runs[0].events / 3  # whole periods were skipped


def test_bounded_pools_same_results():
    """Waiting jobs and a binding pool: placements come from departures the skip must not pass."""
    cluster = cluster_from_dict({"rollout": {"nodes": 3}, "train": {"nodes": 3}})
    jobs, _ = load_trace("philly-mix", cluster, 0)
    jobs = jobs[:60]
    runs = [simulate(jobs, cluster, make_policy("rollmux", 0), "worst", 0, fast_forward=ff) for ff in (False, True)]
    assert any(o.wait_s > 0 for o in runs[0].jobs)
    assert_same(*runs)
    assert [n for _, n in runs[0].queue_series] == [n for _, n in runs[1].queue_series]
    assert all(_close(x, y) for (x, _), (y, _) in zip(runs[0].queue_series, runs[1].queue_series))


def test_job_joining_a_frozen_group():
    """B packs into A's group long after A's schedule became periodic: the group is thawed
    mid-period at B's arrival, and both end exactly when the event-by-event run says."""
    jobs = [Job("a", 100.0, 30.0, slo=2.0, arrival_s=0.0, iterations=400),
            Job("b", 30.0, 100.0, slo=2.0, arrival_s=20_017.5, iterations=300)]
    runs = [simulate(jobs, Cluster(), make_policy("rollmux", 0), "worst", 0, fast_forward=ff) for ff in (False, True)]
    slow, fast = runs
    assert slow.jobs[1].group_id == slow.jobs[0].group_id  # b really joined a's group
    assert_same(slow, fast)
    assert fast.events < 100 < slow.events


def test_stochastic_durations_are_not_skipped():
    jobs = [Job("a", 100.0, 30.0, slo=2.0, iterations=50)]
    slow = simulate(jobs, Cluster(), make_policy("solo-d"), "stochastic", 3, fast_forward=False)
    fast = simulate(jobs, Cluster(), make_policy("solo-d"), "stochastic", 3)
    assert fast.events == slow.events and fast.jobs[0].end_s == slow.jobs[0].end_s


def test_periods_before_is_the_last_whole_period_strictly_before():
    c = Cycle(t1=10.0, period=3.0, gains={"a": 1}, busy=(0.0, 0.0), periods=5, ends={})
    assert c.periods_before(10.5) == 0
    assert c.periods_before(13.0) == 0  # 10 + 3 = 13 is not before 13
    assert c.periods_before(13.1) == 1
    assert c.periods_before(25.0) == 4  # 10 + 5 x 3 = 25: not before
    assert c.periods_before(1e9) == 5  # never beyond the bound
    assert Cycle(0.0, 0.1, {}, (), None, {}).periods_before(0.30000000000000004) == 2
    assert c.wake_s == 25.0
