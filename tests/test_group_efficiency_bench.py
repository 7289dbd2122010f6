"""benchmarks/group_efficiency.py's yardstick (``--bill``): every job for its whole run in
the best group of identical jobs its own SLO allows, checked on jobs whose best group is
known by hand, and benchmarks/waste_breakdown.py's split of the bill by job type."""
from __future__ import annotations

from pathlib import Path

import pytest

from rollmux.model import Cluster, Job, SwitchCost
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate

FREE = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))


def test_best_groups_known_by_hand(benchmark_script):
    bench = benchmark_script("group_efficiency")
    # R = T: two members take turns on one node per pool with neither node ever idle
    # (slowdown 1.0, so even an SLO of 1.0 allows it); two nodes wide alike
    pair = [Job("p", 100.0, 100.0, slo=1.0, iterations=10, model="even"),
            Job("w", 100.0, 100.0, 16, 16, slo=1.0, iterations=10, model="wide")]
    # R = 3 T: four members, each on its own rollout node, share one training node at
    # solo speed (4 x 100 s of training per 400 s iteration); any fewer leave it idle
    alone = Job("a", 300.0, 100.0, slo=1.0, iterations=10, model="lopsided")
    per_type = bench.partnered([*pair, alone], FREE)
    for model in ("even", "wide"):
        work, cost, shapes = per_type[model]
        assert cost == pytest.approx(work) and shapes == {"2/1/1": 1}
    work, cost, shapes = per_type["lopsided"]
    price_r, price_t = FREE.node_price("rollout"), FREE.node_price("train")
    assert shapes == {"4/4/1": 1}
    assert work / cost == pytest.approx((4 * 300.0 * price_r + 4 * 100.0 * price_t) / 400.0 / (4 * price_r + price_t))
    # with a switch cost, the training node's turns take longer than the rollouts: a
    # member slows down, which an SLO of 1.0 refuses, so alone is all that is left
    switching = Cluster(switch_cost=SwitchCost("fixed", 5.0, 5.0))
    work, cost, shapes = bench.partnered([alone], switching)["lopsided"]
    assert shapes == {"1/1/1": 1}


def test_the_split_by_type_adds_up_to_the_node_bill(benchmark_script, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    bench = benchmark_script("waste_breakdown")
    jobs = [Job(f"j{i}", 100.0 + 40 * i, 80.0, slo=1.6, arrival_s=600.0 * i, iterations=30,
                model=("x", "y")[i % 2]) for i in range(6)]
    types = bench.TypeLedger()
    result = simulate(jobs, FREE, make_policy("rollmux"), on_change=types.observe)
    cost = sum(v[0] for v in types.by_type.values())
    assert set(types.by_type) == {"x", "y"}
    assert cost == pytest.approx(result.used_cost - result.reward_cost, rel=1e-9)
    assert all(0 < work < node for node, work in types.by_type.values())


def test_a_job_with_colocated_timings_is_offered_alone_on_its_training_nodes(benchmark_script):
    from rollmux import colocation
    from rollmux.traces.builtin import load_trace

    bench = benchmark_script("group_efficiency")
    job = next(j for j in load_trace("production")[0] if j.model == "8B_32k")
    rows = {shape: (eff, slowdown) for eff, shape, slowdown, _ in bench.shape_rows(job, Cluster(), 2.0)}
    assert rows["colo"][1] == pytest.approx(colocation.iteration_s(job, Cluster()) / job.t_solo)
    assert "colo" not in {shape for _, shape, *_ in bench.shape_rows(job, Cluster(), rows["colo"][1] * 0.99)}
