"""The placement space beyond the paper: training scaling and co-location, in the
planner, the exact solver, regrouping and the simulator.

The brute force here shares nothing with ``rollmux.exact`` but the problem statement:
every set partition of the jobs, for every block every (rollout, training) node count
and every pinning (``itertools.combinations`` per member), and for a one-job block the
co-located option at its effective cost (slowdown x its training nodes' price).
"""
from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitions import cheapest_partition
from rollmux import colocation
from rollmux.accounting import PAPER
from rollmux.exact import solve
from rollmux.improve import improve
from rollmux.intra import MemberProfile, analyze
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job, PoolSpec, SwitchCost
from rollmux.plan_state import PlanState
from rollmux.planner import COLOCATE, FULL_SPACE, PAPER_SPACE, SLO_EPS, Planner, Space
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate

BIG = Cluster(rollout=PoolSpec("H20", 1.85, 2048.0), train=PoolSpec("H800", 5.28, 2048.0))
TRAIN_ONLY = Space(train_scaling=True)


def _jobs(rng: random.Random, n: int) -> list[Job]:
    out = []
    for i in range(n):
        gpus = (8 if rng.random() < 0.8 else 16, 8 if rng.random() < 0.85 else 16)
        out.append(Job(f"j{i}", float(rng.randint(20, 300)), float(rng.randint(20, 300)), *gpus,
                       mem_roll_gb=rng.choice([100.0, 300.0, 500.0]), mem_train_gb=rng.choice([100.0, 300.0, 600.0]),
                       slo=round(rng.uniform(1.0, 2.0), 3), model=rng.choice(["7B", "14B"]),
                       arrival_s=float(rng.randint(0, 50))))
    return out


def _cluster(rng: random.Random) -> Cluster:
    mem = rng.choice([700.0, 1024.0, 2048.0])
    return Cluster(rollout=PoolSpec("H20", 1.85, mem), train=PoolSpec("H800", 5.28, mem),
                   switch_cost=rng.choice([SwitchCost("warm"), SwitchCost("fixed", 0.0, 0.0)]),
                   max_group_size=rng.choice([3, 5]))


# --- brute force ---------------------------------------------------------------------
def _pins(cluster: Cluster, block: list[Job], pool: str, k: int):
    gpn = cluster.gpus_per_node
    for pins in itertools.product(*(itertools.combinations(range(k), j.nodes(pool, gpn)) for j in block)):
        if len(set().union(*pins)) != k:
            continue
        used: dict[int, float] = {}
        for j, nodes in zip(block, pins):
            for x in nodes:
                used[x] = used.get(x, 0.0) + j.mem(pool)
        if all(v <= cluster.pool(pool).host_mem_gb for v in used.values()):
            yield pins


def _block_cost(cluster: Cluster, block: list[Job], space: Space) -> float:
    if len(block) > cluster.max_group_size:
        return float("inf")
    gpn, sw = cluster.gpus_per_node, cluster.switch_cost
    need = {p: [j.nodes(p, gpn) for j in block] for p in POOLS}
    best = float("inf")
    if len(block) == 1 and space.colocation:
        j = block[0]
        if (colocation.iteration_s(j, cluster) / j.t_solo <= j.slo * (1 + SLO_EPS)
                and j.mem_roll_gb + j.mem_train_gb <= cluster.pool(TRAIN).host_mem_gb):
            best = colocation.slowdown(j, cluster) * need[TRAIN][0] * cluster.node_price(TRAIN)
    t_top = sum(need[TRAIN]) if space.train_scaling else max(need[TRAIN])
    for r in range(max(need[ROLLOUT]), sum(need[ROLLOUT]) + 1):
        for t in range(max(need[TRAIN]), t_top + 1):
            cost = r * cluster.node_price(ROLLOUT) + t * cluster.node_price(TRAIN)
            if cost >= best:
                continue
            for roll in _pins(cluster, block, ROLLOUT, r):
                for train in _pins(cluster, block, TRAIN, t):
                    profiles = [MemberProfile(j.job_id, j.t_roll_s, j.t_train_s, tuple(f"R{x}" for x in roll[i]),
                                              tuple(f"T{x}" for x in train[i]), sw.seconds(j.model, ROLLOUT),
                                              sw.seconds(j.model, TRAIN)) for i, j in enumerate(block)]
                    ok = True
                    for size in range(1, len(block) + 1):  # robust: every subset keeps its SLOs
                        for keep in itertools.combinations(range(len(block)), size):
                            a = analyze([profiles[i] for i in keep])
                            ok = ok and all(a.slowdown[block[i].job_id] <= block[i].slo * (1 + SLO_EPS) for i in keep)
                    if ok:
                        best = min(best, cost)
    return best


def brute_force(cluster: Cluster, jobs: list[Job], space: Space) -> float:
    ordered = sorted(jobs, key=lambda j: (j.arrival_s, jobs.index(j)))
    return cheapest_partition(ordered, lambda block: _block_cost(cluster, block, space), key=lambda j: j.job_id)


# --- the exact solver ------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 3), st.sampled_from([TRAIN_ONLY, FULL_SPACE, Space(colocation=True)]))
def test_exact_matches_brute_force_in_the_full_space(seed, n, space):
    rng = random.Random(seed)
    cluster, jobs = _cluster(rng), _jobs(rng, n)
    space = dataclasses.replace(space, all_starts=False)  # the brute force checks the analysed steady state only
    got = solve(cluster, jobs, robust=True, space=space)
    assert got.objective == pytest.approx(brute_force(cluster, jobs, space), rel=1e-9)
    state = got.to_state()  # the placements rebuild a plan of that objective
    assert state.effective_cost_per_hour() == pytest.approx(got.objective, rel=1e-9)
    assert sorted(state.job_group) == sorted(j.job_id for j in jobs)
    for group in state.groups.values():
        if group.colocated:
            (member,) = group.members
            assert not group.rollout_nodes and member.rollout_nodes == member.train_nodes
            assert colocation.slowdown(member.job, cluster) <= member.job.slo * (1 + SLO_EPS)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**6), st.integers(3, 5))
def test_each_space_is_at_least_as_cheap_as_the_paper_one_and_the_planner_never_beats_it(seed, n):
    rng = random.Random(seed)
    cluster, jobs = _cluster(rng), _jobs(rng, n)
    paper = solve(cluster, jobs, robust=True).objective
    full = solve(cluster, jobs, robust=True, space=FULL_SPACE).objective
    scaled = solve(cluster, jobs, robust=True, space=TRAIN_ONLY).objective
    assert full <= scaled + 1e-9 and scaled <= paper + 1e-9
    for space, optimum in ((TRAIN_ONLY, scaled), (FULL_SPACE, full)):
        planner, state = Planner(space=space), PlanState(cluster)
        for job in sorted(jobs, key=lambda j: j.arrival_s):
            decision = planner.decide(state, job)
            state.apply(job, decision.placement)
        assert state.effective_cost_per_hour() >= optimum - 1e-9
        before = state.effective_cost_per_hour()
        improve(state, space=space)
        assert optimum - 1e-9 <= state.effective_cost_per_hour() <= before + 1e-9


# --- the example: four train-heavy one-node jobs -------------------------------
TRAIN_HEAVY = [Job(f"j{i}", r, t, 8, 8, 100.0, 100.0, slo=s, model="7B", arrival_s=float(i))
               for i, (r, t, s) in enumerate([(40, 110, 1.6), (80, 300, 1.7), (120, 450, 1.8), (160, 590, 1.9)])]


def test_training_scaling_shares_one_rollout_node_where_the_paper_model_needs_four_groups():
    paper = solve(BIG, TRAIN_HEAVY, robust=True)
    scaled = solve(BIG, TRAIN_HEAVY, robust=True, space=TRAIN_ONLY)
    assert paper.cost_per_hour == pytest.approx(4 * (14.8 + 42.24))  # $228.16/h
    assert scaled.cost_per_hour == pytest.approx(14.8 + 4 * 42.24)  # $183.76/h
    (group,) = scaled.groups
    assert len(group.rollout_nodes) == 1 and len(group.train_nodes) == 4
    # the online planner gets there too: each job takes one new training node and the rollout node
    planner, state = Planner(space=TRAIN_ONLY), PlanState(BIG)
    kinds = []
    for job in TRAIN_HEAVY:
        decision = planner.decide(state, job)
        kinds.append(decision.outcome)
        state.apply(job, decision.placement)
    assert kinds == ["new-group", "scaled-train", "scaled-train", "scaled-train"]
    assert state.cost_per_hour() == pytest.approx(183.76)
    paper_planner, paper_state = Planner(), PlanState(BIG)
    for job in TRAIN_HEAVY:
        paper_state.apply(job, paper_planner.decide(paper_state, job).placement)
    assert paper_state.cost_per_hour() == pytest.approx(228.16)


# --- co-location ---------------------------------------------------------------------
def test_colocation_is_chosen_when_it_costs_less_than_a_new_group_and_meets_the_slo():
    job = Job("c", 100.0, 300.0, 8, 8, 100.0, 100.0, slo=1.3, model="7B")
    slow = colocation.slowdown(job, BIG)  # (100 x 4.0/3.35 + 300 + 2 warm switches) / 400
    assert 1.0 < slow < 1.3
    decision = Planner(space=FULL_SPACE).decide(PlanState(BIG), job, explain=True)
    assert decision.outcome == "co-located" and decision.placement.colocated
    assert decision.marginal_cost == pytest.approx(slow * 42.24)
    assert decision.placement.rollout_nodes == decision.placement.train_nodes
    new = [c for c in decision.candidates if c.kind == "new-group"]
    assert new and new[0].marginal_cost == pytest.approx(57.04)
    # a tighter SLO: rejected with the reason, the new group wins
    strict = Job("s", 100.0, 300.0, 8, 8, 100.0, 100.0, slo=1.05, model="7B")
    decision = Planner(space=FULL_SPACE).decide(PlanState(BIG), strict, explain=True)
    assert decision.outcome == "new-group"
    (colo,) = [c for c in decision.candidates if c.kind == COLOCATE]
    assert colo.verdict == "rejected" and "co-located" in colo.reason and "> 1.050" in colo.reason


def test_colocation_is_never_offered_where_it_does_not_apply():
    job = Job("c", 100.0, 300.0, 8, 8, 100.0, 100.0, slo=1.3, model="7B")
    for planner, j in ((Planner(space=PAPER_SPACE), job), (Planner(space=TRAIN_ONLY), job),
                       (Planner(accounting=PAPER, space=FULL_SPACE), job),
                       (Planner(space=FULL_SPACE), Job("a", 100.0, 300.0, 8, 8, 100.0, 100.0, slo=1.3, model="7B",
                                                       staleness=1))):
        decision = planner.decide(PlanState(BIG), j, explain=True)
        assert decision.outcome == "new-group"
        assert not any(c.kind == COLOCATE for c in decision.candidates)
    # both phases' state must fit one node
    tight = Cluster(rollout=PoolSpec("H20", 1.85, 150.0), train=PoolSpec("H800", 5.28, 150.0))
    decision = Planner(space=FULL_SPACE).decide(PlanState(tight), job, explain=True)
    assert decision.outcome == "new-group"
    (colo,) = [c for c in decision.candidates if c.kind == COLOCATE]
    assert "200 GB (both phases)" in colo.reason


def test_a_colocated_job_runs_colocated_in_the_simulator_until_a_regrouping_moves_it():
    jobs = [Job("c", 100.0, 300.0, 8, 8, 100.0, 100.0, slo=1.3, model="7B", iterations=20),
            Job("p", 300.0, 100.0, 8, 8, 100.0, 100.0, slo=2.0, model="7B", arrival_s=10.0, iterations=20)]
    still = simulate(jobs, BIG, make_policy("rollmux-full"))
    by_id = {j.job_id: j for j in still.jobs}
    assert by_id["c"].outcome == "co-located"
    # its iterations took the co-located time, and it kept its SLO
    assert by_id["c"].slowdown == pytest.approx(colocation.slowdown(jobs[0], BIG), rel=1e-6)
    assert by_id["c"].slo_met and by_id["p"].slo_met
    # the second job is not packed into the co-located group (it has no rollout node to share)
    assert by_id["p"].group_id != by_id["c"].group_id
    from rollmux.report.tables import placement_counts  # the simulate table's placement column

    assert placement_counts(still.outcomes) == "0/0/1 +1 co-located"  # p could pair with a c-like job: a group
    # with regrouping, the arrival that opened p's group pairs the two (cheaper than c
    # co-located next to p's own group): c moves, runs its profile from then on, and both keep their SLOs
    moved = simulate(jobs, BIG, make_policy("rollmux-full-regroup"))
    assert moved.outcomes["regrouped"] == 2 and moved.cost_per_hour < still.cost_per_hour
    by_id = {j.job_id: j for j in moved.jobs}
    assert by_id["c"].group_id == by_id["p"].group_id
    assert by_id["c"].slo_met and by_id["p"].slo_met


# --- a job that only runs co-located (Job.colocate: veRL's hybrid engine) --------------
def test_a_colocate_job_gets_co_location_alone_in_every_space_and_no_one_joins_it():
    hybrid = Job("h", 100.0, 200.0, 16, 16, 50.0, 100.0, slo=1.2, model="7B", colocate=True)
    for space in (PAPER_SPACE, FULL_SPACE):
        state = PlanState(BIG)
        state.apply(Job("x", 100.0, 100.0, 8, 8, 50.0, 50.0, slo=3.0), Planner().decide(state, Job(
            "x", 100.0, 100.0, 8, 8, 50.0, 50.0, slo=3.0)).placement)
        decision = Planner(space=space).decide(state, hybrid, explain=True)
        assert decision.outcome == "co-located"
        assert decision.placement.rollout_nodes == decision.placement.train_nodes == ("T1", "T2")
        assert decision.marginal_cost == pytest.approx(2 * 42.24)  # its profile is co-located: slowdown 1
        kinds = {c.kind: c for c in decision.candidates}
        assert set(kinds) == {"new-group", COLOCATE} and "colocate" in kinds["new-group"].reason
        fast = Planner(space=space).decide(state, hybrid)
        assert (fast.outcome, fast.placement, fast.marginal_cost) == (decision.outcome, decision.placement,
                                                                      decision.marginal_cost)
        state.apply(hybrid, decision.placement)
        # a job that would happily share goes elsewhere: a co-located group takes no one
        other = Job("y", 50.0, 50.0, 8, 8, 10.0, 10.0, slo=3.0)
        assert state.job_group[hybrid.job_id] != Planner(space=space).decide(state, other).placement.group_id
    # under the paper's accounting too, and the exact solver keeps it co-located in both spaces
    assert Planner(accounting=PAPER).decide(PlanState(BIG), hybrid).outcome == "co-located"
    jobs = [hybrid, Job("z", 100.0, 100.0, 8, 8, 50.0, 50.0, slo=1.05, arrival_s=1.0)]  # too strict to co-locate
    for space in (PAPER_SPACE, FULL_SPACE):
        solution = solve(BIG, jobs, robust=True, space=space)
        (colo,) = [g for g in solution.groups if g.colocated]
        assert [m.job.job_id for m in colo.members] == ["h"] and len(colo.train_nodes) == 2
        assert solution.objective == pytest.approx(2 * 42.24 + 14.8 + 42.24)


def test_every_policy_runs_a_colocate_job_co_located_at_its_profile():
    jobs = [Job("h", 100.0, 200.0, 8, 8, 50.0, 100.0, slo=1.2, model="7B", colocate=True, iterations=10),
            Job("d", 100.0, 200.0, 8, 8, 50.0, 100.0, slo=1.5, model="7B", iterations=10, arrival_s=5.0)]
    for name in ("rollmux", "rollmux-full-regroup", "solo-d", "colocated", "gavel", "random", "most-idle"):
        result = simulate(jobs, BIG, make_policy(name))
        by_id = {j.job_id: j for j in result.jobs}
        assert by_id["h"].slowdown == pytest.approx(1.0) and by_id["h"].slo_met, name
        assert by_id["h"].group_id != by_id["d"].group_id, name


def test_colocate_in_a_trace_the_api_and_the_control_plane(tmp_path):
    from rollmux.errors import SpecError, TraceFormatError
    from rollmux.runtime.api_models import JobSpec
    from rollmux.runtime.control import ControlPlane
    from rollmux.traces.format import read_trace, write_trace

    hybrid = Job("h", 10.0, 20.0, 8, 8, 50.0, 100.0, slo=1.5, model="7B", colocate=True, iterations=2)
    write_trace([hybrid, Job("d", 10.0, 20.0, model="7B", iterations=2)], tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text()
    assert text.splitlines()[0].endswith(",colocate") and ",true" in text and ",false" in text
    assert read_trace(tmp_path / "t.csv")[0] == hybrid
    (tmp_path / "bad.csv").write_text(text.replace(",true", ",yes"))
    with pytest.raises(TraceFormatError, match="line 2.*colocate.*'yes' is not true, false, 1 or 0"):
        read_trace(tmp_path / "bad.csv")
    with pytest.raises(SpecError, match="colocate"):
        Job("a", 10.0, 20.0, staleness=1, colocate=True).validate()
    with pytest.raises(SpecError, match="both phases' state"):
        Job("m", 10.0, 20.0, mem_roll_gb=1100.0, mem_train_gb=1000.0, colocate=True).validate(BIG)
    assert JobSpec(job_id="h", t_roll_s=10.0, t_train_s=20.0, colocate=True).to_job().colocate
    # the live control plane: both phases on the same training nodes, in turn
    cp = ControlPlane(Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                              switch_cost=SwitchCost("fixed")))
    rec = cp.submit(hybrid, 0.0, "0" * 64)
    assert rec.rollout_nodes == rec.train_nodes == ("T0",) and cp.plan.groups[rec.group_id].colocated
    now = 0.0
    for _ in range(2):
        for phase in ("rollout", "train"):
            grant = cp.acquire("h", phase)
            assert grant.nodes == ("T0",) and cp.executors[rec.group_id].busy_nodes() == {"T0": "h"}
            now += 1.0
            cp.release("h", phase, grant.seq, 1.0, now)
    assert rec.state == "done" and rec.iterations_done == 2


def test_rollmux_plan_in_the_full_space(tmp_path):
    import json

    from typer.testing import CliRunner

    from rollmux.cli import app
    from rollmux.traces.format import write_trace

    write_trace([dataclasses.replace(j, iterations=100) for j in TRAIN_HEAVY], tmp_path / "four.csv")
    runner = CliRunner()
    costs = {}
    for space in ("paper", "full"):
        for flags in ((), ("--optimal",)):
            out = tmp_path / f"{space}{len(flags)}.json"
            r = runner.invoke(app, ["plan", "--jobs", str(tmp_path / "four.csv"), "--space", space, "--no-explain",
                                    "--json", str(out), *flags])
            assert r.exit_code == 0, r.output
            costs[space, bool(flags)] = json.loads(out.read_text())
    assert costs["paper", True]["cost_per_hour"] == pytest.approx(228.16)
    assert costs["full", False]["cost_per_hour"] == pytest.approx(183.76)  # one rollout node, four training nodes
    optimum = costs["full", True]  # every job co-located: $168.96/h, at their slowdowns $178.96/h
    assert optimum["cost_per_hour"] == pytest.approx(4 * 42.24)
    assert all(g["colocated"] and g["jobs"][0]["slowdown"] > 1.0 for g in optimum["groups"])
    assert "--space" in runner.invoke(app, ["plan", "--help"]).output
    bad = runner.invoke(app, ["plan", "--jobs", str(tmp_path / "four.csv"), "--space", "fast"])
    assert bad.exit_code != 0 and "fast" in bad.output

