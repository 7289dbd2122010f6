"""The planner admits no asynchronous job (nor a member beside one) whose SLO breaks:
random small mixes of synchronous and asynchronous jobs, placed by RollMux and replayed
by the simulator under worst-case durations; every job's measured per-iteration
slowdown (against ``Job.solo_run_s``) must be within its SLO."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.model import Cluster, Job
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.sim.metrics import SLO_TOLERANCE

_job = st.tuples(st.integers(5, 200), st.integers(5, 200), st.sampled_from([1.0, 1.1, 1.3, 1.6, 2.0, 3.0]),
                 st.sampled_from([0, 0, 1, 2]), st.integers(5, 60), st.integers(0, 4000), st.sampled_from([8, 16]))


def _jobs(spec) -> list[Job]:
    return [Job(f"j{i}", float(r), float(t), rollout_gpus=g, slo=slo, staleness=k, iterations=n,
                arrival_s=float(a), model="7B") for i, (r, t, slo, k, n, a, g) in enumerate(spec)]


@settings(max_examples=80, deadline=None)
@given(st.lists(_job, min_size=2, max_size=5))
def test_no_admitted_job_misses_its_slo_with_async_members(spec):
    jobs = _jobs(spec)
    result = simulate(jobs, Cluster(), make_policy("rollmux"))
    assert not result.rejected
    for j in result.jobs:
        assert j.slowdown <= j.slo * (1 + SLO_TOLERANCE), (j.job_id, j.kind, j.slowdown, j.slo, j.group_id)


def test_an_async_job_alone_has_slowdown_one_and_runs_apart():
    """Asynchronous jobs open groups of their own (planner.ASYNC_APART); synchronous ones
    still share among themselves."""
    jobs = [Job("a", 100.0, 20.0, slo=1.2, staleness=1, iterations=40, model="7B"),
            Job("s", 20.0, 30.0, slo=1.5, iterations=40, arrival_s=1.0, model="7B"),
            Job("t", 30.0, 20.0, slo=1.5, iterations=40, arrival_s=2.0, model="7B")]
    solo = simulate(jobs, Cluster(), make_policy("solo-d"))
    assert [round(j.slowdown, 12) for j in solo.jobs] == [1.0, 1.0, 1.0]
    assert solo.jobs[0].solo_s == 40 * 100 + 20  # n max(R, T) + min(R, T)
    mux = simulate(jobs, Cluster(), make_policy("rollmux"))
    group = {j.job_id: j.group_id for j in mux.jobs}
    assert group["a"] not in (group["s"], group["t"]) and group["s"] == group["t"]
    assert all(j.slo_met for j in mux.jobs) and mux.total_cost < solo.total_cost
    assert set(mux.per_kind()) == {"sync", "async"} and mux.per_kind()["async"]["jobs"] == 1
