"""benchmarks/planner_latency.py --policy rollmux-hedge: each probe's placement and the
regrouping it then asks for are timed without changing the running jobs' plan."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("planner_latency")


def _plan(state) -> tuple:
    groups = {gid: (tuple(m.job.job_id for m in g.members), tuple(g.rollout_nodes), tuple(g.train_nodes))
              for gid, g in state.groups.items()}
    return dict(state.job_group), groups, state.cost_per_hour()


def test_a_hedge_probe_leaves_the_plan_as_it_found_it(bench):
    policy, state, probes = bench.hedge_build(6, 1)
    assert len(state.job_group) == 6
    # the build applied the policy's gatherings: some group holds more than one job
    assert any(len(g.members) > 1 for g in state.groups.values())
    before = _plan(state)
    timed = []
    for job in probes[:8]:
        place, regroup = bench.hedge_probe(policy, state, job, passes=2)
        assert place > 0 and (regroup is None or regroup > 0)
        assert _plan(state) == before, job.job_id
        assert job.job_id not in state.job_group
        timed.append(regroup)
    assert any(r is not None for r in timed)  # arrivals that open a group were regrouped


def test_the_hedge_table_prints_one_row_per_size(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["planner_latency.py", "--policy", "rollmux-hedge", "--sizes", "5,7",
                                      "--probes", "3", "--passes", "1"])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("policy: rollmux-hedge")
    rows = [line.split() for line in out[2:]]
    assert [r[0] for r in rows] == ["5", "7"]
    assert out[1].split()[-6:] == ["answer", "ms", "answer", "x", "build", "s"]
    for r in rows:
        median, p99 = float(r[2]), float(r[3])
        assert 0 < median <= p99
        answer = float(r[-3])  # each probe's placement alone: never more than with its regrouping
        assert 0 < answer <= median
        if r[4] != "-":  # a size the paper measured (5 here; not 7)
            # (printed to 0.1x: on a loaded machine the ratio may fall below 5, where that is over 1%)
            assert float(r[-2].rstrip("x")) == pytest.approx(float(r[4]) / answer, rel=0.01, abs=0.051)
