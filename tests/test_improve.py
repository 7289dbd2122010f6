"""Regrouping (``rollmux.improve``): cheaper, still feasible, locally optimal, bounded;
and its online form ``plan_regroup`` (whole groups move only when every job keeps pace).

Feasibility is checked here from the problem statement, not through the planner: every
job placed once, group size, node counts, residency, the SLO of every member and of
every subset of members (departures), the start-up allowance of jobs with a known
length in a shared group, and the bounded inventory.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollmux.exact import solve
from rollmux.improve import improve, left_in_place, materialize, plan_regroup, shape
from rollmux.intra import analyze
from rollmux.model import POOLS, TRAIN, Cluster, Group, Job, Member, NodeSpec, PoolSpec, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, SLO_EPS, Planner
from rollmux.waste import waste_per_hour

MEM = {"7B": (275.7, 240.0), "14B": (445.4, 456.1), "32B": (490.3, 520.4)}


def make_jobs(rng: random.Random, n: int) -> list[Job]:
    jobs = []
    for i in range(n):
        model = rng.choice(list(MEM))
        jobs.append(Job(f"j{i}", float(rng.randint(30, 300)), float(rng.randint(30, 300)),
                        rollout_gpus=16 if rng.random() < 0.15 else 8, train_gpus=16 if rng.random() < 0.1 else 8,
                        mem_roll_gb=MEM[model][0], mem_train_gb=MEM[model][1],
                        slo=round(rng.uniform(1.0, 2.0), 3), model=model, arrival_s=float(i),
                        iterations=rng.choice([None, 20, 200])))
    return jobs


def make_cluster(rng: random.Random) -> Cluster:
    mem = rng.choice([1024.0, 2048.0])
    return Cluster(rollout=PoolSpec("H20", 1.85, mem), train=PoolSpec("H800", 5.28, mem),
                   switch_cost=rng.choice([SwitchCost("warm"), SwitchCost("fixed", 0.0, 0.0)]),
                   max_group_size=rng.choice([3, 5]))


def placed(cluster: Cluster, jobs: list[Job]) -> PlanState:
    planner, state = Planner(), PlanState(cluster)
    for job in jobs:
        d = planner.decide(state, job)
        assert d.placement is not None
        state.apply(job, d.placement)
    return state


def carry_out(state: PlanState, plan) -> None:
    """Apply an online regrouping at once: its groups' jobs leave, its new groups open."""
    for gid in plan.replaced:
        for m in list(state.groups[gid].members):
            state.release(m.job.job_id)
    for g in plan.groups:
        materialize(state, g)


def check_feasible(state: PlanState, jobs: list[Job]) -> None:
    cluster, gpn = state.cluster, state.cluster.gpus_per_node
    assert sorted(state.job_group) == sorted(j.job_id for j in jobs)
    seen = {p: set() for p in POOLS}
    for group in state.groups.values():
        members = group.members
        assert 1 <= len(members) <= cluster.max_group_size
        assert all(state.job_group[m.job.job_id] == group.group_id for m in members)
        for pool in POOLS:
            assert not seen[pool] & set(group.nodes(pool))  # groups share no node
            seen[pool] |= set(group.nodes(pool))
            for node in group.nodes(pool):
                assert any(node in m.nodes(pool) for m in members)
                assert group.mem_used(node, pool) <= state.capacity(pool, node)
        for m in members:
            for pool in POOLS:
                assert len(set(m.nodes(pool))) == m.job.nodes(pool, gpn)
                assert set(m.nodes(pool)) <= set(group.nodes(pool))
        for size in range(1, len(members) + 1):
            for keep in itertools.combinations(members, size):
                a = analyze([state.profile(m) for m in keep])
                for m in keep:
                    assert a.slowdown[m.job.job_id] <= m.job.slo * (1 + SLO_EPS)
        a = analyze([state.profile(m) for m in members])
        for m in members:
            if m.job.iterations is not None and len(members) > 1:  # alone, a job never waits
                mean = a.iteration_s[m.job.job_id] + a.period / m.job.iterations
                assert mean <= m.job.slo * m.job.t_solo * (1 + SLO_EPS)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(4, 8), st.sampled_from([2, 3]))
def test_improve_lowers_cost_keeps_every_constraint_and_never_beats_the_optimum(seed, n, max_groups):
    rng = random.Random(seed)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, n)
    state = placed(cluster, jobs)
    before = state.cost_per_hour()
    result = improve(state, max_groups=max_groups)
    assert result.cost_before == pytest.approx(before)
    assert result.cost_after == pytest.approx(state.cost_per_hour()) and result.cost_after <= before + 1e-9
    assert result.local_optimum and not result.skipped
    for move in result.moves:
        assert move.cost_after < move.cost_before
        assert sorted(j for _, js in move.before for j in js) == sorted(j for _, js in move.after for j in js)
    assert before - sum(m.cost_before - m.cost_after for m in result.moves) == pytest.approx(result.cost_after)
    check_feasible(state, jobs)
    assert result.cost_after >= solve(cluster, jobs, robust=True).cost_per_hour - 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_a_local_optimum_has_no_cheaper_pair_of_groups(seed):
    """The contract of a local optimum, re-checked with the exact solver pair by pair
    (long-running jobs, so that no start-up allowance vetoes a cheaper pair)."""
    rng = random.Random(seed)
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    jobs = [replace(j, iterations=None) for j in make_jobs(rng, 9)]
    state = placed(cluster, jobs)
    assert improve(state, max_groups=2).local_optimum
    for a, b in itertools.combinations(list(state.groups.values()), 2):
        union = sorted((m.job for g in (a, b) for m in g.members), key=lambda j: j.arrival_s)
        if len(union) <= 10:
            pair = a.cost_per_hour(cluster) + b.cost_per_hour(cluster)
            assert solve(cluster, union, robust=True).cost_per_hour >= pair - 1e-6


def test_regrouping_finds_what_arrival_order_missed():
    """On arrival b joins a on a second rollout node; c and d then fit neither a's group
    nor each other, so arrival order ends with three groups. Pairing b with c and a
    with d needs two groups of one node per pool each: the optimum."""
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    jobs = [Job("a", 80.0, 80.0, slo=2.0, arrival_s=0.0), Job("b", 40.0, 20.0, slo=1.5, arrival_s=1.0),
            Job("c", 20.0, 60.0, slo=1.5, arrival_s=2.0), Job("d", 20.0, 100.0, slo=1.5, arrival_s=3.0)]
    state = placed(cluster, jobs)
    assert [[m.job.job_id for m in g.members] for g in state.groups.values()] == [["a", "b"], ["c"], ["d"]]
    result = improve(state)
    assert sorted([m.job.job_id for m in g.members] for g in state.groups.values()) == [["a", "d"], ["b", "c"]]
    assert result.cost_after == pytest.approx(solve(cluster, jobs, robust=True).cost_per_hour)
    assert result.cost_after == pytest.approx(2 * (cluster.node_price("rollout") + cluster.node_price(TRAIN)))
    check_feasible(state, jobs)


def test_bounded_pools_keep_their_inventory():
    rng = random.Random(7)
    jobs = make_jobs(rng, 8)
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=12), train=PoolSpec("H800", 5.28, nodes=9),
                      switch_cost=SwitchCost("fixed", 0.0, 0.0))
    state = placed(cluster, jobs)
    improve(state)
    check_feasible(state, jobs)
    for pool, total in ((p, cluster.pool(p).nodes) for p in POOLS):
        used = {n for g in state.groups.values() for n in g.nodes(pool)}
        assert used <= {f"{'R' if pool != TRAIN else 'T'}{i}" for i in range(total)}
        assert len(used) + state.free_count(pool) == total


def test_mixed_node_memory_is_left_alone():
    nodes = (NodeSpec("big", 2048.0), NodeSpec("small", 1024.0))
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, 2048.0, nodes=2, node_list=nodes))
    jobs = make_jobs(random.Random(3), 3)
    state = placed(replace(cluster), jobs)
    groups = {g: [m.job.job_id for m in grp.members] for g, grp in state.groups.items()}
    result = improve(state)
    assert "different host memory" in result.skipped and not result.moves
    assert {g: [m.job.job_id for m in grp.members] for g, grp in state.groups.items()} == groups


def test_solve_limit_stops_the_search():
    rng = random.Random(11)
    jobs = make_jobs(rng, 9)
    state = placed(Cluster(), jobs)
    seen = []
    result = improve(state, max_solves=1, on_solve=lambda n, cost: seen.append(n))
    assert result.solves == 1 and seen == [1]
    assert not result.local_optimum  # this instance needs 14 solves to reach one
    with pytest.raises(ValueError, match="max_groups"):
        improve(state, max_groups=1)


def test_plan_regroup_moves_whole_groups_only_when_every_job_keeps_pace():
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    jobs = [Job("a", 80.0, 80.0, slo=2.0, arrival_s=0.0), Job("b", 40.0, 20.0, slo=1.5, arrival_s=1.0),
            Job("c", 20.0, 60.0, slo=1.5, arrival_s=2.0), Job("d", 20.0, 100.0, slo=1.5, arrival_s=3.0)]
    state = placed(cluster, jobs)  # g0 {a, b} on two rollout nodes, g1 {c}, g2 {d}
    roomy = lambda k: (100, 1e9)  # noqa: E731
    plan = plan_regroup(state, "g1", roomy, lambda k: 0.0)
    assert plan is not None and "g1" in plan.replaced and len(plan.replaced) == 2
    assert plan.cost_after < plan.cost_before
    moved = sorted(m.job.job_id for g in plan.groups for m in g.members)
    assert moved == sorted(m.job.job_id for gid in plan.replaced for m in state.groups[gid].members)
    # no job may move, or none has the time: nothing is planned
    assert plan_regroup(state, "g1", lambda k: None if k == "c" else (100, 1e9), lambda k: 0.0) is None
    tight = {j.job_id: (100, 100 * j.t_solo) for j in jobs}  # solo pace from now on
    assert plan_regroup(state, "g1", tight.get, lambda k: 0.0) is None
    # carried out: the new groups hold exactly the moved jobs and keep every constraint
    before = state.cost_per_hour()
    carry_out(state, plan)
    assert state.cost_per_hour() == pytest.approx(before - plan.cost_before + plan.cost_after)
    check_feasible(state, jobs)


def test_plan_regroup_on_a_bounded_pool_counts_free_and_emptied_nodes():
    """The least wasteful regrouping of {a, b} and {c} (below) needs three rollout nodes;
    the two groups it empties hold two. With a bounded rollout pool of three nodes (one
    free) it is kept; with two (none free) it is refused, and the cheapest regrouping,
    on two rollout nodes, still fits and is kept under the cost objective."""
    jobs = [Job("a", 244.0, 127.0, slo=1.699, arrival_s=0.0), Job("b", 282.0, 108.0, slo=1.693, arrival_s=1.0),
            Job("c", 129.0, 43.0, slo=1.912, arrival_s=2.0)]
    roomy = lambda k: (100, 1e9)  # noqa: E731
    for nodes, lean_kept in ((3, True), (2, False)):
        state = placed(Cluster(rollout=PoolSpec("H20", 1.85, nodes=nodes)), jobs)
        assert state.free_count("rollout") == nodes - 2
        lean = plan_regroup(state, "g1", roomy, lambda k: 0.0, objective="waste")
        if lean_kept:
            assert [len(g.rollout_nodes) for g in lean.groups] == [3]
        else:
            assert lean is None or sum(len(g.rollout_nodes) for g in lean.groups) <= 2
        cheap = plan_regroup(state, "g1", roomy, lambda k: 0.0)
        assert [len(g.rollout_nodes) for g in cheap.groups] == [2]
        # what it counted on is there once the two groups are empty
        carry_out(state, cheap)
        check_feasible(state, jobs)


def test_pace_on_a_bounded_pool_counts_the_longest_pause_of_every_moved_job():
    """On a bounded pool a new group may wait for nodes that another new group's members
    still hold, so with ``joint_pause`` each group's pace is checked with the longest
    pause of every moved job: x keeps pace with its own pause (none) and not with y's."""
    from rollmux.improve import keeps_pace
    from rollmux.planner import TRANSIENT_PERIODS

    jobs = [Job("x", 100.0, 100.0, slo=1.0, arrival_s=0.0), Job("y", 100.0, 100.0, slo=1.0, arrival_s=1.0)]
    solution = solve(Cluster(), jobs, robust=True)
    assert len(solution.groups) == 2  # SLO 1.0: neither may share
    state = PlanState(Cluster())
    period = {m.job.job_id: analyze([state.profile(m, g.colocated) for m in g.members]).period
              for g in solution.groups for m in g.members}
    spare = {"x": 200.0 * 10 + TRANSIENT_PERIODS * period["x"] + 50.0, "y": 1e9}
    progress = lambda k: (10, spare[k])  # noqa: E731
    pause = {"x": 0.0, "y": 100.0}.__getitem__
    assert keeps_pace(state, solution.groups, progress, pause)
    assert not keeps_pace(state, solution.groups, progress, pause, joint_pause=True)
    pause = {"x": 0.0, "y": 40.0}.__getitem__
    assert keeps_pace(state, solution.groups, progress, pause, joint_pause=True)


def test_plan_regroup_by_waste_takes_the_wider_group_that_slows_no_one():
    """{a, b} on 1 + 1 nodes and {c} alone: the cheapest regrouping puts all three on two
    rollout nodes ($71.84/h); the least wasteful pays a third rollout node ($86.64/h)
    because on two the members lose more work per hour than the node costs."""
    jobs = [Job("a", 244.0, 127.0, slo=1.699, arrival_s=0.0), Job("b", 282.0, 108.0, slo=1.693, arrival_s=1.0),
            Job("c", 129.0, 43.0, slo=1.912, arrival_s=2.0)]
    state = placed(Cluster(), jobs)
    assert [[m.job.job_id for m in g.members] for g in state.groups.values()] == [["a", "b"], ["c"]]
    roomy = lambda k: (100, 1e9)  # noqa: E731
    cheap = plan_regroup(state, "g1", roomy, lambda k: 0.0)
    lean = plan_regroup(state, "g1", roomy, lambda k: 0.0, objective="waste")
    assert cheap.waste_before is None and cheap.gain == pytest.approx(cheap.cost_before - cheap.cost_after)
    assert [len(p.groups[0].rollout_nodes) for p in (cheap, lean)] == [2, 3]
    assert lean.cost_before == pytest.approx(cheap.cost_before) and lean.cost_after > cheap.cost_after
    assert lean.waste_before == pytest.approx(waste_per_hour(state))
    after = {}
    for name, plan in (("cheap", cheap), ("lean", lean)):
        copy = placed(Cluster(), jobs)
        carry_out(copy, plan)
        check_feasible(copy, jobs)
        after[name] = waste_per_hour(copy)
    assert after["lean"] == pytest.approx(lean.waste_after)
    assert lean.gain == pytest.approx(lean.waste_before - after["lean"])
    assert after["lean"] < after["cheap"] < lean.waste_before


def test_a_group_keeps_its_shape_under_other_node_names_and_admission_orders():
    a, b, c = (Job(k, 60.0, 60.0) for k in "abc")
    g = Group("g3", ["R0", "R1"], ["T0"], [Member(a, ("R0",), ("T0",)), Member(b, ("R1",), ("T0",)),
                                            Member(c, ("R1",), ("T0",))])
    renamed = Group("g0", ["x", "y"], ["z"], [Member(c, ("y",), ("z",)), Member(a, ("x",), ("z",)),
                                              Member(b, ("y",), ("z",))])
    regrouped = Group("g0", ["x", "y"], ["z"], [Member(a, ("x",), ("z",)), Member(b, ("x",), ("z",)),
                                                Member(c, ("y",), ("z",))])
    assert shape(renamed) == shape(g) != shape(regrouped)
    other = Group("g4", ["R2"], ["T1"], [Member(Job("d", 60.0, 60.0), ("R2",), ("T1",))])
    moved_d = Group("g1", [], ["w"], [Member(Job("d", 60.0, 60.0), ("w",), ("w",))], colocated=True)
    assert left_in_place((g, other), (renamed, moved_d)) == ((other,), (moved_d,))
    assert left_in_place((g, other), (regrouped, moved_d)) == ((g, other), (regrouped, moved_d))


def test_a_regrouping_leaves_a_group_it_would_re_create_in_place():
    """a and c (training-heavy, SLO 1.0) cannot share, so each opens a group. With
    co-location the pair's optimum runs c on its training node alone and a exactly as now:
    only c's group is replaced (a is not paused for nothing), and the costs are c's."""
    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    jobs = [Job("a", 10.0, 100.0, slo=1.0, arrival_s=0.0),
            Job("c", 10.0, 100.0, slo=1.0, arrival_s=1.0, t_roll_colo_s=10.0, t_train_colo_s=100.0)]
    state = placed(cluster, jobs)
    assert [[m.job.job_id for m in g.members] for g in state.groups.values()] == [["a"], ["c"]]
    roomy = lambda k: (100, 1e9)  # noqa: E731
    node = cluster.gpus_per_node * cluster.train.price_per_gpu_hour
    for objective in ("cost", "waste"):
        plan = plan_regroup(state, "g0", roomy, lambda k: 0.0, space=FULL_SPACE, objective=objective)
        assert plan.replaced == ("g1",)
        assert [([m.job.job_id for m in g.members], g.colocated) for g in plan.groups] == [(["c"], True)]
        assert plan.cost_before == pytest.approx(state.group_cost_per_hour("g1"))
        assert plan.cost_after == pytest.approx(node)
    a_group = (state.groups["g0"].rollout_nodes, state.groups["g0"].train_nodes)
    before = state.cost_per_hour()
    carry_out(state, plan)
    kept = state.groups["g0"]
    assert state.job_group["a"] == "g0" and (kept.rollout_nodes, kept.train_nodes) == a_group
    assert state.cost_per_hour() == pytest.approx(before - plan.cost_before + plan.cost_after)
    # offline too: the move names c's group only
    offline = improve(placed(cluster, jobs), space=FULL_SPACE)
    assert [(m.before, [jobs for _, jobs in m.after]) for m in offline.moves] == [((("g1", ("c",)),), [("c",)])]
    assert offline.moves[0].cost_before - offline.moves[0].cost_after == pytest.approx(plan.cost_before - node)


def test_a_group_with_a_member_below_slo_one_is_never_re_solved():
    """On a fleet, a job may run co-located on a view where, disaggregated, it would miss
    its deadline even alone: its translation there has an SLO below 1, which the exact
    solver refuses (``rollmux fleet simulate --jobs production`` on three types stopped
    with that SpecError in a regrouping). Such a group is left as it is; the others
    still regroup."""
    from rollmux.plan_state import Placement

    cluster = Cluster(switch_cost=SwitchCost("fixed", 0.0, 0.0))
    jobs = [Job("a", 10.0, 100.0, slo=1.0, arrival_s=0.0),
            Job("c", 10.0, 100.0, slo=1.0, arrival_s=1.0, t_roll_colo_s=10.0, t_train_colo_s=100.0)]
    state = placed(cluster, jobs)
    tight = replace(Job("x", 100.0, 100.0, arrival_s=2.0, t_roll_colo_s=50.0, t_train_colo_s=100.0), slo=0.95)
    state.apply(tight, Placement.colocated_on(state.peek_new(TRAIN, 1, 0.0)))
    gid = state.job_group["x"]
    roomy = lambda k: (100, 1e9)  # noqa: E731
    for objective in ("cost", "waste"):
        assert plan_regroup(state, gid, roomy, lambda k: 0.0, space=FULL_SPACE, objective=objective) is None
        plan = plan_regroup(state, "g0", roomy, lambda k: 0.0, space=FULL_SPACE, objective=objective)
        assert plan.replaced == ("g1",) and gid not in plan.replaced
    offline = improve(state, space=FULL_SPACE)
    assert state.job_group["x"] == gid and all(gid not in dict(m.before) for m in offline.moves)


def test_improve_stops_at_its_time_bound_keeping_the_plan_so_far():
    """(rollmux plan had no time bound: in the full space, 20 jobs ran past five minutes of solves)
    A clock that advances one second per reading: max_seconds=2.5 allows the solves begun before
    2.5 s had passed, then stops short of the local optimum, the plan as good as the moves made."""
    rng = random.Random(1)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, 8)
    free = placed(cluster, jobs)
    unbounded = improve(free, max_groups=3)
    assert unbounded.local_optimum and unbounded.solves > 3
    ticks = itertools.count()
    state = placed(cluster, jobs)
    result = improve(state, max_groups=3, max_seconds=2.5, clock=lambda: float(next(ticks)))
    assert (result.local_optimum, result.limit, result.solves) == (False, "seconds", 2)
    assert result.cost_after == pytest.approx(state.cost_per_hour()) and result.cost_after <= result.cost_before
    check_feasible(state, jobs)
    assert improve(placed(cluster, jobs), max_groups=3, max_solves=2).limit == "solves"


def test_improve_stops_when_asked_between_solves_keeping_the_moves_made():
    """``stop`` (the CLI's first Ctrl-C) is asked before each solve: answering True after
    k solves ends the search there, short of the local optimum, with the moves the
    unstopped search had made by then, and the plan feasible; always False, it changes
    nothing."""
    rng = random.Random(4)
    cluster = make_cluster(rng)
    jobs = make_jobs(rng, 6)
    unbounded = improve(placed(cluster, jobs), max_groups=3)
    assert unbounded.local_optimum and len(unbounded.moves) == 3
    made = set()
    for k in range(1, unbounded.solves):
        asked = itertools.count(1)
        state = placed(cluster, jobs)
        result = improve(state, max_groups=3, stop=lambda: next(asked) > k)
        assert (result.local_optimum, result.limit, result.solves) == (False, "interrupted", k)
        assert result.moves == unbounded.moves[:len(result.moves)]
        assert result.cost_after == pytest.approx(state.cost_per_hour()) and result.cost_after <= result.cost_before
        check_feasible(state, jobs)
        made.add(len(result.moves))
    assert made == {0, 1, 2, 3}  # stopped before the first move, between moves and after the last
    never = improve(placed(cluster, jobs), max_groups=3, stop=lambda: False)
    assert (never.local_optimum, never.solves, never.cost_after) == (True, unbounded.solves, unbounded.cost_after)


def test_in_the_full_space_each_move_reports_the_dollars_per_hour_of_its_groups():
    """(Each move's costs were effective ones, co-located groups weighted by their slowdown,
    though printed as $/h: the moves' savings summed to $20.12/h while the plan's $/h fell
    by $29.60.) Here the plan's $/h falls by exactly the sum of its moves' differences, and
    no move's figures are the effective ones."""
    from rollmux.traces.generate import generate
    jobs = generate(6, 1)
    state, planner = PlanState(Cluster()), Planner(space=FULL_SPACE)
    for job in jobs:
        state.apply(job, planner.decide(state, job).placement)
    before, effective = state.cost_per_hour(), state.effective_cost_per_hour()
    result = improve(state, space=FULL_SPACE)
    assert result.moves and effective - state.effective_cost_per_hour() != pytest.approx(before - state.cost_per_hour())
    saved = sum(m.cost_before - m.cost_after for m in result.moves)
    assert saved == pytest.approx(before - state.cost_per_hour(), rel=1e-12)
    m = result.moves[-1]
    assert m.cost_after == pytest.approx(sum(state.group_cost_per_hour(gid) for gid, _ in m.after))
    assert m.describe().endswith(f"${m.cost_before:.2f}/h -> ${m.cost_after:.2f}/h")
