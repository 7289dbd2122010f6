"""The waste rate (``rollmux.waste``) by hand, and the identity that makes it the objective:
node $ = the fixed price of the jobs' work + the integral of the waste rate."""
from __future__ import annotations

import pytest

from rollmux.model import Cluster, Job, SwitchCost
from rollmux.plan_state import Placement, PlanState
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate
from rollmux.waste import WasteLedger, group_waste, iteration_value, max_work_rate, waste_per_hour

CLUSTER = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
PRICE_R, PRICE_T = CLUSTER.node_price("rollout"), CLUSTER.node_price("train")  # $14.80/h, $42.24/h


def test_a_pair_on_one_node_of_each_pool_by_hand():
    a, b = Job("a", 100.0, 50.0), Job("b", 100.0, 50.0, arrival_s=1.0)
    state = PlanState(CLUSTER)
    gid = state.apply(a, Placement(None, ("R0",), ("T0",), ("R0",), ("T0",)))
    alone = PRICE_R + PRICE_T - (100 * PRICE_R + 50 * PRICE_T) / 150  # one iteration in 150 s
    assert group_waste(state, gid) == pytest.approx(alone)
    state.apply(b, Placement(gid, ("R0",), ("T0",)))
    # two rollouts of 100 s share R0: each job iterates every 200 s
    assert state.analysis(gid).iteration_s == pytest.approx({"a": 200.0, "b": 200.0})
    pair = PRICE_R + PRICE_T - 2 * (100 * PRICE_R + 50 * PRICE_T) / 200
    assert group_waste(state, gid) == pytest.approx(pair) and waste_per_hour(state) == pytest.approx(pair)
    assert iteration_value(Job("w", 100.0, 50.0, rollout_gpus=16), CLUSTER) == pytest.approx(
        200 * PRICE_R + 50 * PRICE_T)
    assert max_work_rate(a, CLUSTER) == pytest.approx((100 * PRICE_R + 50 * PRICE_T) / 150)


def test_node_cost_is_the_work_plus_the_waste_over_time():
    """Two jobs of equal work that share one group for their whole runs: the replay's node $
    is the price of their iterations plus the pair's waste rate over the group's life, up
    to the transients at both ends (b's first rollout waits for a's, and b runs its last
    iteration alone): 0.27% here. Counting the pair's iterations at their solo length
    instead would miss by 21%."""
    jobs = [Job("a", 100.0, 50.0, arrival_s=0.0, iterations=60, slo=2.0),
            Job("b", 100.0, 50.0, arrival_s=0.0, iterations=60, slo=2.0)]
    result = simulate(jobs, CLUSTER, make_policy("rollmux"))
    assert result.summary()["placements"] == {"new-group": 1, "packed": 1}
    state = PlanState(CLUSTER)
    gid = state.apply(jobs[0], Placement(None, ("R0",), ("T0",), ("R0",), ("T0",)))
    state.apply(jobs[1], Placement(gid, ("R0",), ("T0",)))
    work = sum(60 * iteration_value(j, CLUSTER) for j in jobs) / 3600
    span_h = max(o.end_s for o in result.jobs) / 3600
    node_cost = result.used_cost - result.reward_cost
    assert node_cost == pytest.approx((PRICE_R + PRICE_T) * span_h)
    assert node_cost == pytest.approx(work + group_waste(state, gid) * span_h, rel=0.005)


def test_the_ledger_splits_a_replays_node_cost_by_group_shape():
    """Integrated between plan changes, the groups' $/h add up to the replay's node cost
    exactly (the plan holds between changes), and their work at analysed iteration times
    comes within the transients of the work the jobs' iterations are worth."""
    jobs = generate(14, seed=3, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    ledger = WasteLedger()
    result = simulate(jobs, CLUSTER, make_policy("rollmux-regroup"), on_change=ledger.observe)
    node, got = ledger.totals()
    assert node == pytest.approx(result.used_cost - result.reward_cost, rel=1e-9)
    by_id = {j.job_id: j for j in jobs}
    work = sum(o.iterations * iteration_value(by_id[o.job_id], CLUSTER) for o in result.jobs) / 3600
    assert got == pytest.approx(work, rel=0.05) and got < node
    assert sum(h for h, _, _ in ledger.by_key.values()) > 0
    for (size, models, n_r, n_t, colocated), (hours, cost, work_k) in ledger.by_key.items():
        assert len(models) == size and n_r >= 1 and n_t >= 1 and not colocated
        assert cost == pytest.approx(hours * (n_r * PRICE_R + n_t * PRICE_T))  # a shape's nodes, for its hours
        assert 0 < work_k <= cost + 1e-9  # no node is busier than all the time
