"""Cost by placement kind (``rollmux.sim.metrics.CostShares``, ``PolicyResult.cost_by_placement``):
a group's $/h split equally among its members at every instant, summed per kind."""
from __future__ import annotations

import dataclasses
import math

import pytest

from rollmux.accounting import PAPER
from rollmux.model import ROLLOUT, TRAIN, Cluster, Job
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.sim.metrics import CostShares
from rollmux.traces.builtin import load_trace

CLUSTER = Cluster()


def test_two_jobs_share_their_group_by_the_hour():
    """a opens a group; b packs next to it 1,000 s later; each pays the whole group while
    alone and half of it while both run."""
    a = Job("a", 100.0, 100.0, 8, 8, 100.0, 100.0, 2.0, "7B", iterations=40)
    b = Job("b", 100.0, 100.0, 8, 8, 100.0, 100.0, 2.0, "7B", iterations=30, arrival_s=1000.0)
    result = simulate([a, b], CLUSTER, make_policy("rollmux"))
    assert result.outcomes["new-group"] == 1 and result.outcomes["packed"] == 1
    end = {j.job_id: j.end_s for j in result.jobs}
    rate = CLUSTER.node_price(ROLLOUT) + CLUSTER.node_price(TRAIN)
    both = min(end["a"], end["b"]) - 1000.0
    alone_after = abs(end["a"] - end["b"])
    expect_a = rate / 3600 * (1000.0 + both / 2 + (alone_after if end["a"] > end["b"] else 0.0))
    expect_b = rate / 3600 * (both / 2 + (alone_after if end["b"] > end["a"] else 0.0))
    table = result.cost_by_placement
    assert table["new-group"]["jobs"] == 1 and table["packed"]["jobs"] == 1
    assert math.isclose(table["new-group"]["cost"], expect_a, rel_tol=1e-9)
    assert math.isclose(table["packed"]["cost"], expect_b, rel_tol=1e-9)
    assert math.isclose(table["new-group"]["share"] + table["packed"]["share"], 1.0)
    assert result.summary()["cost_by_placement"] == table


@pytest.mark.parametrize("policy", ["rollmux", "rollmux-consolidate", "rollmux-regroup", "rollmux-full",
                                    "rollmux-host", "solo-d", "colocated"])
def test_the_kinds_add_up_to_the_node_cost(policy):
    """Moves (repacked, regrouped), the full space's kinds and hosting included."""
    jobs, _ = load_trace("production")
    jobs = jobs[:60]
    result = simulate(jobs, CLUSTER, make_policy(policy))
    table = result.cost_by_placement
    assert math.isclose(sum(k["cost"] for k in table.values()), result.used_cost - result.reward_cost, rel_tol=1e-9)
    assert math.isclose(sum(k["share"] for k in table.values()), 1.0)
    assert set(table) <= set(result.outcomes)  # every kind is a placement the policy made
    assert result.pool_gpu_seconds == pytest.approx(result.gpu_seconds)  # two pools: per role
    if policy == "rollmux-regroup":
        assert result.outcomes["regrouped"] and table["regrouped"]["cost"] > 0


def test_fixed_departures_and_a_bounded_pool_add_up_too():
    jobs, _ = load_trace("production")
    jobs = jobs[:60]
    result = simulate(jobs, CLUSTER, make_policy("rollmux", accounting=PAPER), accounting=PAPER)
    assert math.isclose(sum(k["cost"] for k in result.cost_by_placement.values()), result.used_cost, rel_tol=1e-9)
    bounded = dataclasses.replace(CLUSTER, rollout=dataclasses.replace(CLUSTER.rollout, nodes=6))
    result = simulate(jobs, bounded, make_policy("rollmux"))
    assert result.bounded and math.isclose(sum(k["cost"] for k in result.cost_by_placement.values()),
                                           result.used_cost, rel_tol=1e-9)


def test_cost_shares_split_equally_and_settle_once():
    shares = CostShares()
    shares.track("g", 0.0, 36.0, [("a", "new-group")])
    shares.settle("g", 100.0)  # a alone: 36 $/h for 100 s = $1
    shares.track("g", 100.0, 72.0, [("a", "new-group"), ("b", "packed")])
    shares.settle("g", 200.0)  # 72 $/h for 100 s = $2, $1 each
    shares.settle("g", 300.0)  # nothing open: no charge
    shares.track("h", 300.0, 3600.0, [("c", "packed")])
    shares.close(301.0)  # $1 more for packed
    assert shares.table() == {"new-group": {"jobs": 1, "cost": 2.0, "share": 0.5},
                              "packed": {"jobs": 2, "cost": 2.0, "share": 0.5}}
