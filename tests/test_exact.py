"""The exact solver against a naive brute force, its own constraints, and the planner.

The brute force shares nothing with ``rollmux.exact`` but the problem statement: it
enumerates every set partition of the jobs and, for every block, every rollout node
count and every pinning (``itertools.combinations`` per member, no symmetry breaking,
no bounds), keeping the cheapest block whose pinning keeps residency and every SLO
under ``intra.analyze`` (with ``robust``, for every subset of the block as well).
"""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitions import cheapest_partition
from rollmux.exact import ExactLimitError, lower_bound, objective_lower_bound, solve
from rollmux.intra import MemberProfile, analyze, worst_start
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job, PoolSpec, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import SLO_EPS, Planner, Space
from rollmux.waste import waste_per_hour

MEM = {"7B": (275.7, 240.0), "14B": (445.4, 456.1), "32B": (490.3, 520.4)}  # Table 2, GB per node


def make_jobs(rng: random.Random, n: int, multi_node: bool = True) -> list[Job]:
    """Random jobs; arrival order differs from list order to exercise admission order."""
    jobs = []
    arrivals = rng.sample(range(100), n)
    for i in range(n):
        model = rng.choice(list(MEM))
        roll_gpus = 16 if multi_node and rng.random() < 0.15 else 8
        train_gpus = 16 if multi_node and rng.random() < 0.1 else 8
        jobs.append(Job(f"j{i}", float(rng.randint(30, 300)), float(rng.randint(30, 300)),
                        rollout_gpus=roll_gpus, train_gpus=train_gpus,
                        mem_roll_gb=MEM[model][0], mem_train_gb=MEM[model][1],
                        slo=round(rng.uniform(1.0, 2.0), 3), model=model, arrival_s=float(arrivals[i])))
    return jobs


def make_cluster(rng: random.Random) -> Cluster:
    mem = rng.choice([1024.0, 2048.0])
    switch = rng.choice([SwitchCost("warm"), SwitchCost("fixed", 0.0, 0.0), SwitchCost("cold")])
    return Cluster(rollout=PoolSpec("H20", 1.85, mem), train=PoolSpec("H800", 5.28, mem),
                   switch_cost=switch, max_group_size=rng.choice([3, 5]))


# --- brute force ---------------------------------------------------------------------
def _fits(cluster: Cluster, block: list[Job], pool: str, pins: tuple[tuple[int, ...], ...]) -> bool:
    used: dict[int, float] = {}
    for job, nodes in zip(block, pins):
        for x in nodes:
            used[x] = used.get(x, 0.0) + job.mem(pool)
    return all(v <= cluster.pool(pool).host_mem_gb for v in used.values())


def _slo_ok(block: list[Job], profiles: list[MemberProfile], every_start: bool = True) -> bool:
    """The steady state within every SLO and, with ``every_start`` (the solver's default
    space), also the slowest start in every order of the members."""
    a = analyze(profiles)
    if not all(a.slowdown[j.job_id] <= j.slo * (1 + SLO_EPS) for j in block):
        return False
    if not every_start:
        return True
    worst = worst_start(profiles, orders=True)
    return all(worst[j.job_id] <= j.slo * j.t_solo * (1 + SLO_EPS) for j in block)


def _feasible_shapes(cluster: Cluster, block: list[Job], robust: bool, every_start: bool):
    """Every feasible (rollout nodes, training nodes, member profiles) of the block, rollout
    nodes ascending; no pinning symmetry is used."""
    if len(block) > cluster.max_group_size:
        return
    gpn, sw = cluster.gpus_per_node, cluster.switch_cost
    need = {p: [j.nodes(p, gpn) for j in block] for p in POOLS}
    t = max(need[TRAIN])
    trains = [pins for pins in itertools.product(*(itertools.combinations(range(t), k) for k in need[TRAIN]))
              if _fits(cluster, block, TRAIN, pins)]
    for r in range(max(need[ROLLOUT]), sum(need[ROLLOUT]) + 1):
        for roll in itertools.product(*(itertools.combinations(range(r), k) for k in need[ROLLOUT])):
            if len(set().union(*roll)) != r or not _fits(cluster, block, ROLLOUT, roll):
                continue
            for train in trains:
                profiles = [MemberProfile(j.job_id, j.t_roll_s, j.t_train_s, tuple(f"R{x}" for x in roll[i]),
                                          tuple(f"T{x}" for x in train[i]), sw.seconds(j.model, ROLLOUT),
                                          sw.seconds(j.model, TRAIN)) for i, j in enumerate(block)]
                subsets = [keep for size in range(1, len(block) + 1) if robust or size == len(block)
                           for keep in itertools.combinations(range(len(block)), size)]
                if all(_slo_ok([block[i] for i in keep], [profiles[i] for i in keep], every_start) for keep in subsets):
                    yield r, t, profiles


def _block_cost(cluster: Cluster, block: list[Job], robust: bool) -> float:
    for r, t, _ in _feasible_shapes(cluster, block, robust, every_start=True):  # the default space
        return r * cluster.node_price(ROLLOUT) + t * cluster.node_price(TRAIN)
    return float("inf")


def _block_waste(cluster: Cluster, block: list[Job], robust: bool) -> float:
    """The least of node $/h minus sum_j (busy node-$ of j's solo iteration) / (its iteration)."""
    gpn, best = cluster.gpus_per_node, float("inf")
    for r, t, profiles in _feasible_shapes(cluster, block, robust, every_start=False):  # as its test's space
        iteration = analyze(profiles).iteration_s
        work = sum((j.t_roll_s * j.nodes(ROLLOUT, gpn) * cluster.node_price(ROLLOUT)
                    + j.t_train_s * j.nodes(TRAIN, gpn) * cluster.node_price(TRAIN)) / iteration[j.job_id]
                   for j in block)
        best = min(best, r * cluster.node_price(ROLLOUT) + t * cluster.node_price(TRAIN) - work)
    return best


def brute_force(cluster: Cluster, jobs: list[Job], robust: bool = False, objective: str = "cost") -> float:
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, jobs.index(j)))
    block_value = _block_cost if objective == "cost" else _block_waste
    return cheapest_partition(ordered, lambda block: block_value(cluster, block, robust), key=lambda j: j.job_id)


# --- tests ---------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(3, 4), st.booleans())
def test_matches_brute_force(seed, n, robust):
    rng = random.Random(seed)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, n)
    expected = brute_force(cluster, jobs, robust)
    assert solve(cluster, jobs, robust=robust).cost_per_hour == pytest.approx(expected, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 4), st.booleans())
def test_waste_objective_matches_brute_force(seed, n, robust):
    rng = random.Random(seed)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, n)
    space = Space(all_starts=False)  # the brute force checks the analysed steady state only
    expected = brute_force(cluster, jobs, robust, objective="waste")
    solution = solve(cluster, jobs, robust=robust, space=space, objective="waste")
    assert solution.objective == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert waste_per_hour(solution.to_state()) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    cheapest = solve(cluster, jobs, robust=robust, space=space)
    assert waste_per_hour(cheapest.to_state()) >= solution.objective - 1e-9
    assert solution.cost_per_hour >= cheapest.cost_per_hour - 1e-9
    assert objective_lower_bound(cluster, jobs, space, "waste") <= solution.objective + 1e-9
    under = solve(cluster, jobs, robust=robust, space=space, objective="waste", budget=solution.objective + 1.0)
    assert under is not None and under.objective == pytest.approx(solution.objective, rel=1e-9, abs=1e-9)
    assert solve(cluster, jobs, robust=robust, space=space, objective="waste", budget=solution.objective) is None


def test_the_cheapest_plan_is_not_the_least_wasteful():
    """Three rollout-heavy jobs: the cheapest group shares two rollout nodes among them and
    slows them down; a third rollout node costs $14.80/h and gives back more work than that."""
    jobs = [Job("a", 244.0, 127.0, slo=1.699, arrival_s=0.0), Job("b", 282.0, 108.0, slo=1.693, arrival_s=1.0),
            Job("c", 129.0, 43.0, slo=1.912, arrival_s=2.0)]
    cluster, space = Cluster(), Space(all_starts=False)
    cheapest = solve(cluster, jobs, robust=True, space=space)
    leanest = solve(cluster, jobs, robust=True, space=space, objective="waste")
    for solution in (cheapest, leanest):
        assert [[m.job.job_id for m in g.members] for g in solution.groups] == [["a", "b", "c"]]
    assert [len(cheapest.groups[0].rollout_nodes), len(leanest.groups[0].rollout_nodes)] == [2, 3]
    assert leanest.cost_per_hour == pytest.approx(cheapest.cost_per_hour + cluster.node_price(ROLLOUT))
    assert leanest.objective < waste_per_hour(cheapest.to_state()) - 1.0


def check_feasible(cluster: Cluster, jobs: list[Job], solution, robust: bool) -> None:
    state = solution.to_state()
    assert sorted(state.job_group) == sorted(j.job_id for j in jobs)
    assert state.cost_per_hour() == pytest.approx(solution.cost_per_hour)
    assert [g.group_id for g in solution.groups] == list(state.groups)
    gpn = cluster.gpus_per_node
    for group in state.groups.values():
        members = group.members
        assert 1 <= len(members) <= cluster.max_group_size
        arrivals = [m.job.arrival_s for m in members]
        assert arrivals == sorted(arrivals)  # admission order = arrival order
        assert len(group.train_nodes) == max(m.job.nodes(TRAIN, gpn) for m in members)
        for m in members:
            for pool in POOLS:
                assert len(set(m.nodes(pool))) == m.job.nodes(pool, gpn)
                assert set(m.nodes(pool)) <= set(group.nodes(pool))
        for pool in POOLS:
            for node in group.nodes(pool):
                assert any(node in m.nodes(pool) for m in members)  # no idle node
                assert group.mem_used(node, pool) <= cluster.pool(pool).host_mem_gb
        for size in range(1 if robust else len(members), len(members) + 1):
            for keep in itertools.combinations(members, size):
                a = analyze([state.profile(m) for m in keep])
                for m in keep:
                    assert a.slowdown[m.job.job_id] <= m.job.slo * (1 + SLO_EPS)


@pytest.mark.parametrize("seed", range(6))
def test_solution_respects_constraints(seed):
    rng = random.Random(100 + seed)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, 7)
    robust = seed % 2 == 1
    check_feasible(cluster, jobs, solve(cluster, jobs, robust=robust), robust)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(3, 7))
def test_planner_never_beats_exact(seed, n):
    rng = random.Random(seed)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, n)
    steady = solve(cluster, jobs).cost_per_hour
    robust = solve(cluster, jobs, robust=True).cost_per_hour
    assert robust >= steady - 1e-9
    for tie_break in ("first", "best-fit"):
        planner, state = Planner(tie_break), PlanState(cluster)
        for job in sorted(jobs, key=lambda j: j.arrival_s):
            state.apply(job, planner.decide(state, job).placement)
        assert state.cost_per_hour() >= robust - 1e-9


def test_two_complementary_jobs_share_a_group():
    cluster = Cluster(switch_cost=SwitchCost("fixed"))
    jobs = [Job("a", 100.0, 20.0, slo=1.2), Job("b", 20.0, 100.0, slo=1.2, arrival_s=1.0)]
    solution = solve(cluster, jobs)
    assert solution.cost_per_hour == pytest.approx(cluster.node_price(ROLLOUT) + cluster.node_price(TRAIN))
    assert [[m.job.job_id for m in g.members] for g in solution.groups] == [["a", "b"]]
    assert solution.stats.analyze_calls >= 1 and solution.stats.seconds >= 0


def test_limits():
    rng = random.Random(1)
    with pytest.raises(ExactLimitError, match="max_jobs=12"):
        solve(Cluster(), make_jobs(rng, 13))
    with pytest.raises(ExactLimitError, match="max_jobs=3"):
        solve(Cluster(), make_jobs(rng, 4), max_jobs=3)
    with pytest.raises(ExactLimitError, match="bounded"):
        solve(Cluster(rollout=PoolSpec("H20", 1.85, nodes=4)), make_jobs(rng, 2))
    with pytest.raises(ValueError, match="unique"):
        solve(Cluster(), [Job("x", 10.0, 10.0), Job("x", 10.0, 10.0)])
    with pytest.raises(ValueError, match="objective='speed'"):
        solve(Cluster(), make_jobs(rng, 2), objective="speed")


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 6), st.booleans())
def test_budget_finds_the_optimum_exactly_when_it_is_under_the_budget(seed, n, robust):
    rng = random.Random(seed)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, n)
    optimum = solve(cluster, jobs, robust=robust).cost_per_hour
    assert lower_bound(cluster, jobs) <= optimum + 1e-9
    under = solve(cluster, jobs, robust=robust, budget=optimum * 1.001)
    assert under is not None and under.cost_per_hour == pytest.approx(optimum, rel=1e-12)
    assert solve(cluster, jobs, robust=robust, budget=optimum) is None
    assert solve(cluster, jobs, robust=robust, budget=optimum * 0.999) is None
