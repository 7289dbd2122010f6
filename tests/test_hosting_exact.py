"""Hosting in the exact solver and in regrouping (``Space.hosting``).

The brute force here shares nothing with ``rollmux.exact`` but the problem statement
(and the analysis it is stated in): every set partition; for every block every set of
hosted members after the first, every (rollout, training) node count and every pinning
(``itertools.combinations`` per member), a hosted member only on training nodes that a
disaggregated member admitted before it holds, memory per node, the guard, and every
SLO of the block and of each of its subsets, in steady state and from every start in
every order of the members.
"""
from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from partitions import cheapest_partition
from rollmux import colocation, waste
from rollmux.exact import solve
from rollmux.improve import improve, materialize, plan_regroup
from rollmux.intra import MemberProfile, analyze, worst_start
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import HOSTING_SPACE, SLO_EPS, Planner
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from test_placement_space import _cluster  # random clusters: memory, switch cost, group size

CLUSTER = Cluster()


def _jobs(rng: random.Random, n: int) -> list[Job]:
    out = []
    for i in range(n):
        r, t = float(rng.randint(20, 400)), float(rng.randint(20, 300))
        colo = round(r * rng.uniform(0.2, 1.3), 1) if rng.random() < 0.7 else None
        out.append(Job(f"j{i}", r, t, 8 if rng.random() < 0.8 else 16, 8 if rng.random() < 0.8 else 16,
                       mem_roll_gb=rng.choice([100.0, 300.0]), mem_train_gb=rng.choice([100.0, 300.0, 600.0]),
                       slo=round(rng.uniform(1.0, 2.2), 3), model=rng.choice(["7B", "14B"]),
                       arrival_s=float(rng.randint(0, 50)), t_roll_colo_s=colo))
    return out


# --- brute force ---------------------------------------------------------------------
def _profiles(cluster: Cluster, block: list[Job], hosted: tuple[int, ...], roll, train) -> list[MemberProfile]:
    sw = cluster.switch_cost
    out = []
    for i, j in enumerate(block):
        t_nodes = tuple(f"T{x}" for x in train[i])
        if i in hosted:
            phases = [sum(colocation.phase_time(j, p, cluster)) for p in POOLS]
            out.append(MemberProfile(j.job_id, *phases, t_nodes, t_nodes, 0.0, 0.0, 0, j.t_solo))
        else:
            out.append(MemberProfile(j.job_id, j.t_roll_s, j.t_train_s, tuple(f"R{x}" for x in roll[i]), t_nodes,
                                     sw.seconds(j.model, ROLLOUT), sw.seconds(j.model, TRAIN)))
    return out


def _guard_ok(profiles: list[MemberProfile], hosted: tuple[int, ...]) -> bool:
    for h in hosted:
        mine = set(profiles[h].train_nodes)
        for k, m in enumerate(profiles):
            if k != h and mine & set(m.train_nodes) and not mine >= set(m.train_nodes):
                return False
    return True


def _every_slo(block: list[Job], profiles: list[MemberProfile]) -> bool:
    for size in range(2, len(block) + 1):
        for keep in itertools.combinations(range(len(block)), size):
            sub = [profiles[i] for i in keep]
            a, worst = analyze(sub), worst_start(sub, orders=True)  # every start, in every order
            for i in keep:
                limit = block[i].slo * (1 + SLO_EPS)
                if a.slowdown[block[i].job_id] > limit or worst[block[i].job_id] > limit * block[i].t_solo:
                    return False
    return True


def _block_value(cluster: Cluster, block: list[Job], objective: str, train_scaling: bool) -> float:
    if len(block) > cluster.max_group_size:
        return float("inf")
    gpn, cap = cluster.gpus_per_node, {p: cluster.pool(p).host_mem_gb for p in POOLS}
    need = {p: [j.nodes(p, gpn) for j in block] for p in POOLS}
    hostable = [i for i, j in enumerate(block) if i and colocation.slowdown(j, cluster) <= j.slo * (1 + SLO_EPS)
                and colocation.node_mem_gb(j) <= cap[TRAIN]]
    best = float("inf")
    for size in range(len(hostable) + 1):
        for hosted in itertools.combinations(hostable, size):
            plain = [i for i in range(len(block)) if i not in hosted]
            t_top = sum(need[TRAIN][i] for i in plain) if train_scaling else max(need[TRAIN])
            for r, t in itertools.product(range(max(need[ROLLOUT][i] for i in plain),
                                                sum(need[ROLLOUT][i] for i in plain) + 1),
                                          range(max(need[TRAIN]), t_top + 1)):
                cost = r * cluster.node_price(ROLLOUT) + t * cluster.node_price(TRAIN)
                for roll_plain in itertools.product(*(itertools.combinations(range(r), need[ROLLOUT][i])
                                                      for i in plain)):
                    if len(set().union(*roll_plain)) != r:
                        continue
                    roll = dict(zip(plain, roll_plain))
                    for train_all in itertools.product(*(itertools.combinations(range(t), need[TRAIN][i])
                                                         for i in range(len(block)))):
                        if len(set().union(*(train_all[i] for i in plain))) != t:
                            continue
                        if any(not set(train_all[h]) <= set().union(*(train_all[i] for i in plain if i < h))
                               for h in hosted):
                            continue
                        used = {(p, x): 0.0 for p in POOLS for x in range(max(r, t))}
                        for i, j in enumerate(block):
                            for x in train_all[i]:
                                used[TRAIN, x] += colocation.node_mem_gb(j) if i in hosted else j.mem(TRAIN)
                            for x in roll.get(i, ()):
                                used[ROLLOUT, x] += j.mem(ROLLOUT)
                        if any(v > cap[p] for (p, _), v in used.items()):
                            continue
                        profiles = _profiles(cluster, block, hosted, roll, train_all)
                        if not _guard_ok(profiles, hosted) or not _every_slo(block, profiles):
                            continue
                        value = cost
                        if objective == "waste":
                            a = analyze(profiles)
                            value -= sum(waste.iteration_value(j, cluster) / a.iteration_s[j.job_id] for j in block)
                        best = min(best, value)
    return best


def brute_force(cluster: Cluster, jobs: list[Job], objective: str, train_scaling: bool = False) -> float:
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, jobs.index(j)))
    return cheapest_partition(ordered, lambda block: _block_value(cluster, block, objective, train_scaling),
                              key=lambda j: j.job_id)


# the examples, found by mutating the solver: dropping the guard changes the optimum (7, 69),
# letting a hosted member take a node first breaks the rebuild (175), and a waste floor that
# left out a hosted member's rollout work pruned the optimum (396); on 205 the check of
# every order of a group's members changes the optimum
@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 3), st.sampled_from(["cost", "waste"]), st.booleans())
@example(7, 3, "waste", False)
@example(69, 3, "cost", False)
@example(175, 3, "cost", False)
@example(396, 3, "waste", False)
@example(205, 3, "cost", False)
def test_exact_matches_brute_force_with_hosting(seed, n, objective, train_scaling):
    rng = random.Random(seed)
    cluster, jobs = _cluster(rng), _jobs(rng, n)
    space = dataclasses.replace(HOSTING_SPACE, train_scaling=train_scaling)
    got = solve(cluster, jobs, robust=True, space=space, objective=objective)
    expected = brute_force(cluster, jobs, objective, train_scaling)
    assert got.objective == pytest.approx(expected, rel=1e-9, abs=1e-9)
    state = got.to_state()  # the placements rebuild the plan, hosted members included
    value = state.effective_cost_per_hour() if objective == "cost" else waste.waste_per_hour(state)
    assert value == pytest.approx(got.objective, rel=1e-9, abs=1e-9)
    assert sorted(state.job_group) == sorted(j.job_id for j in jobs)
    for group in state.groups.values():
        assert not group.members[0].hosted
        for m in group.members:
            if m.hosted:
                assert m.rollout_nodes == m.train_nodes and set(m.train_nodes) <= set(group.train_nodes)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(3, 5))
def test_hosting_never_costs_more_and_the_planner_never_beats_its_optimum(seed, n):
    rng = random.Random(seed)
    cluster, jobs = _cluster(rng), _jobs(rng, n)
    paper = solve(cluster, jobs, robust=True).objective
    hosting = solve(cluster, jobs, robust=True, space=HOSTING_SPACE).objective
    assert hosting <= paper + 1e-9
    planner, state = Planner(space=HOSTING_SPACE), PlanState(cluster)
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        state.apply(job, planner.decide(state, job).placement)
    before = state.effective_cost_per_hour()
    assert before >= hosting - 1e-9
    improve(state, space=HOSTING_SPACE)
    assert hosting - 1e-9 <= state.effective_cost_per_hour() <= before + 1e-9
    for group in state.groups.values():  # every group is one the planner could keep
        a = state.analysis(group.group_id)
        assert all(a.slowdown[m.job.job_id] <= m.job.slo * (1 + SLO_EPS) for m in group.members)


def _pair() -> tuple[Job, Job]:
    """tests/test_hosting.py's pair: packing h breaks a's SLO, hosting h on a's training node does not."""
    a = Job("a", 500.0, 100.0, 8, 8, 100.0, 100.0, 1.3, "7B", iterations=300)
    h = Job("h", 400.0, 50.0, 8, 8, 100.0, 100.0, 1.5, "7B", iterations=300, arrival_s=1000.0,
            t_roll_colo_s=150.0, t_train_colo_s=50.0)
    return a, h


def test_the_optimum_hosts_where_the_paper_space_needs_a_second_rollout_node():
    a, h = _pair()
    paper = solve(CLUSTER, [a, h], robust=True)
    hosting = solve(CLUSTER, [a, h], robust=True, space=HOSTING_SPACE)
    price = {p: CLUSTER.node_price(p) for p in POOLS}
    assert paper.cost_per_hour == pytest.approx(2 * price[ROLLOUT] + price[TRAIN])
    assert hosting.cost_per_hour == pytest.approx(price[ROLLOUT] + price[TRAIN])
    (group,) = hosting.to_state().groups.values()
    assert [m.hosted for m in group.members] == [False, True]
    # a job that cannot be hosted (co-located it would miss its SLO) is not
    slow = Job("h", 400.0, 50.0, 8, 8, 100.0, 100.0, 1.05, "7B", arrival_s=1000.0, t_roll_colo_s=450.0)
    assert not any(m.hosted for g in solve(CLUSTER, [a, slow], robust=True, space=HOSTING_SPACE).groups
                   for m in g.members)


def _alone(state: PlanState, job: Job) -> str:
    """Open a group of one for ``job`` on fresh nodes."""
    roll, train = state.peek_new(ROLLOUT, 1, job.mem(ROLLOUT)), state.peek_new(TRAIN, 1, job.mem(TRAIN))
    return state.apply(job, Placement(None, roll, train, roll, train))


def test_regrouping_hosts_a_job_and_moves_a_group_that_hosts():
    a, h = _pair()
    state = PlanState(CLUSTER)
    _alone(state, a), _alone(state, h)
    result = improve(state, space=HOSTING_SPACE)
    assert len(result.moves) == 1 and len(state.groups) == 1
    (group,) = state.groups.values()
    assert group.member("h").hosted and not group.member("a").hosted
    assert state.cost_per_hour() == pytest.approx(CLUSTER.node_price(ROLLOUT) + CLUSTER.node_price(TRAIN))
    # a group that hosts takes part in online regrouping: a lone job o joins it on a rollout
    # node of its own, training beside h on a's training node
    o = Job("o", 100.0, 100.0, 8, 8, 100.0, 100.0, 3.0, "7B", iterations=10, arrival_s=2000.0)
    _alone(state, o)
    gid = state.job_group["a"]
    assert plan_regroup(state, gid, lambda k: (10, 1e9), lambda k: 0.0) is None  # paper space: left alone
    move = plan_regroup(state, gid, lambda k: (10, 1e9), lambda k: 0.0, space=HOSTING_SPACE, objective="waste")
    assert move is not None and move.gain > 0 and len(move.groups) == 1
    for g in move.replaced:
        for m in list(state.groups[g].members):
            state.release(m.job.job_id)
    new = state.groups[materialize(state, move.groups[0])]
    assert [(m.job.job_id, m.hosted) for m in new.members] == [("a", False), ("h", True), ("o", False)]
    assert new.member("h").train_nodes == new.member("a").train_nodes == new.member("o").train_nodes
    assert state.cost_per_hour() == pytest.approx(move.cost_after)
    a_ = state.analysis(new.group_id)
    assert all(a_.slowdown[j.job_id] <= j.slo * (1 + SLO_EPS) for j in (a, h, o))


def test_rollmux_host_regroup_replays_its_hosted_members_within_their_slos():
    a, h = _pair()
    result = simulate([a, h], CLUSTER, make_policy("rollmux-host-regroup"))
    assert result.outcomes["hosted"] == 1
    assert all(j.slo_met for j in result.jobs)
    plain = simulate([a, h], CLUSTER, make_policy("rollmux-regroup"))
    assert result.cost_per_hour < plain.cost_per_hour


def test_rollmux_plan_hosts_in_the_hosting_space(tmp_path):
    """``rollmux plan --space host``: greedy, regrouped and --optimal plans host h on a's
    training node ($57.04/h), marked in the JSON and the table; the paper space scales."""
    import json

    from typer.testing import CliRunner

    from rollmux.cli import app
    from rollmux.traces.format import write_trace

    write_trace(list(_pair()), tmp_path / "pair.csv")
    runner = CliRunner()
    for space, flags, cost in (("paper", (), 71.84), ("host", (), 57.04), ("host", ("--optimal",), 57.04)):
        out = tmp_path / "plan.json"
        r = runner.invoke(app, ["plan", "--jobs", str(tmp_path / "pair.csv"), "--space", space, "--no-explain",
                                "--json", str(out), *flags], env={"COLUMNS": "160"})
        assert r.exit_code == 0, r.output
        plan = json.loads(out.read_text())
        assert plan["cost_per_hour"] == pytest.approx(cost)
        hosted = [j["job_id"] for g in plan["groups"] for j in g["jobs"] if j["hosted"]]
        assert hosted == ([] if space == "paper" else ["h"])
        assert ("(hosted)" in r.output) == (space == "host")
    bad = runner.invoke(app, ["fleet", "plan", "--jobs", str(tmp_path / "pair.csv"), "--space", "host"])
    assert bad.exit_code != 0 and "host" in bad.output  # fleets search paper and full only
