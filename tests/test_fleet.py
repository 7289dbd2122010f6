"""Fleets of several GPU types: files, phase times per type, the fleet planner, its exact
optimum (against a brute force), regrouping, the baselines over types and the CLI.

The brute force is the placement-space one (``test_placement_space._block_cost``: every
partition, node count and pinning, analysed) run in every view on the translated jobs,
so it shares with the solver only the problem statement and ``fleet.translate``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from partitions import cheapest_partition
from rollmux.cli import app
from rollmux.errors import CapacityError, SpecError, TraceFormatError
from rollmux.exact import solve
from rollmux.fleet import Fleet, FleetPool, Profiles, fleet_of, load_profiles, roofline_check, translate
from rollmux.fleet_exact import improve_fleet, plan_fleet_regroup, solve_fleet
from rollmux.fleet_file import fleet_from_dict, load_fleet
from rollmux.fleet_planner import FleetPlanner, FleetState, alone_options, alternatives, plan_jobs
from rollmux.intra import analyze
from rollmux.model import GPU_TYPES, ROLLOUT, TRAIN, Cluster, Job, Member
from rollmux.plan_state import Placement, PlanState
from rollmux.planner import FULL_SPACE, PAPER_SPACE, SLO_EPS, Planner
from rollmux.policies import make_policy
from rollmux.policies.fleet import FLEET_ROLLMUX, FleetAlone, FleetRollMux, fleet_policies, fleet_rollmux
from rollmux.policies.rollmux import RollMuxPolicy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace
from rollmux.traces.format import read_trace, write_trace
from rollmux.traces.generate import generate
from test_placement_space import _block_cost

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fleet"
runner = CliRunner()


def _example():
    fleet = load_fleet(EXAMPLE / "three_types.yaml")
    return fleet, load_profiles(EXAMPLE / "profiles.csv", fleet), read_trace(EXAMPLE / "jobs.csv")


# --- files ---------------------------------------------------------------------------
def test_the_three_type_file_fills_figures_from_the_table_and_offers_every_pair():
    fleet, _, _ = _example()
    assert [p.gpu for p in fleet.pools] == ["H20", "H800", "H200"]
    h200 = fleet.pool("H200")
    assert (h200.tflops, h200.tb_per_s, h200.price_per_gpu_hour) == GPU_TYPES["H200"]
    assert len(fleet.views()) == 9
    assert {fleet.colocation_view(p) for p in fleet.pools} == {"H20/H20", "H800/H800", "H200/H200"}


def test_a_two_pool_cluster_file_is_the_fleet_of_its_two_pools_in_fixed_roles(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout: {gpu: H20, price_per_gpu_hour: 2.0}\ntrain: {gpu: H800}\n")
    fleet = load_fleet(path)
    assert [v.name for v in fleet.views()] == ["rollout/train"]
    assert fleet.reference == ("H20", "H800")
    assert fleet.views()[0].cluster.node_price(ROLLOUT) == 16.0
    assert fleet.colocation_view(fleet.pool("train")) == "rollout/train"


@pytest.mark.parametrize("data, field", [
    ({"pools": [{"gpu": "H20"}, {"gpu": "H800", "bogus": 1}]}, "pools[1].bogus"),
    ({"pools": [{"gpu": "L40S"}]}, "pools[0].tflops"),
    ({"pools": [{"gpu": "H20", "roles": ["rollout"]}]}, "pools"),
    ({"pools": [{"gpu": "H20", "roles": ["decode"]}]}, "pools[0].roles"),
    ({"pools": [{"gpu": "H20"}, {"gpu": "H20"}]}, "pools[1].name"),
    ({"pools": [{"gpu": "H20", "tb_per_s": -1.0}]}, "pools[0].tb_per_s"),
    ({"pools": [{"gpu": "H20", "tb_per_s": "4"}]}, "pools[0].tb_per_s"),
    ({"pools": [{"gpu": "H20"}], "reference": {"rollout": "X1"}}, "reference.rollout"),
    ({"pools": []}, "pools"),
    ({"pools": [{"gpu": "H20"}], 1: 2}, "top-level key"),  # (it read "[1]": a list index)
    ({"pools": [{"gpu": "H20", 3: 3}]}, "pools[0] key"),
])
def test_a_bad_fleet_file_names_the_field(data, field):
    with pytest.raises(SpecError) as err:
        fleet_from_dict(data)
    assert err.value.field == field


def test_the_fleet_planner_refuses_the_hosting_space_before_planning():
    # it used to plan, and a hosted member arrived in the analysis with no rollout node (ZeroDivisionError)
    from rollmux.planner import FULL_SPACE, HOSTING_SPACE

    for space in (HOSTING_SPACE, dataclasses.replace(FULL_SPACE, hosting=True)):
        with pytest.raises(SpecError, match="hosting is not offered across views"):
            FleetPlanner(fleet_of(Cluster()), space=space)
    FleetPlanner(fleet_of(Cluster()), space=FULL_SPACE)


def test_a_gpu_type_outside_the_table_is_accepted_with_its_figures():
    fleet = fleet_from_dict({"pools": [{"gpu": "L40S", "tflops": 362.0, "tb_per_s": 0.864,
                                        "price_per_gpu_hour": 1.2}, {"gpu": "H800"}]})
    assert fleet.figures()["L40S"] == (362.0, 0.864)


def test_a_two_pool_command_refuses_a_fleet_file_and_says_which_command_plans_it(tmp_path):
    result = runner.invoke(app, ["plan", "--jobs", str(EXAMPLE / "jobs.csv"),
                                 "--cluster", str(EXAMPLE / "three_types.yaml")])
    assert result.exit_code == 2
    assert "rollmux fleet plan" in result.output


@pytest.mark.parametrize("text, field", [
    ("job,gpu,t_roll_s,t_train_s\n", "header"),
    ("job_id,gpu,t_roll_s,t_train_s\na,TPU,1,\n", "gpu"),
    ("job_id,gpu,t_roll_s,t_train_s\na,H200,-3,\n", "t_roll_s"),
    ("job_id,gpu,t_roll_s,t_train_s\na,H200,1,x\n", "t_train_s"),
    ("job_id,gpu,t_roll_s,t_train_s\na,H200,1,\na,H200,,2\n", "job_id"),
    ("job_id,gpu,t_roll_s,t_train_s\na,H200,1\n", "row"),
])
def test_a_bad_profile_file_names_the_line_and_field(tmp_path, text, field):
    fleet, _, _ = _example()
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as err:
        load_profiles(path, fleet)
    assert err.value.column == field
    assert err.value.line == (1 if field == "header" else text.count("\n"))


def test_a_profile_error_names_the_files_own_line_past_comments_blanks_and_a_bom(tmp_path):
    """Comment and blank lines count in the line named (they were dropped before counting:
    line 3 for the file's line 6), a byte-order mark and a blank last line are no errors,
    a time below 1 ms is refused, and bytes that are not UTF-8 name the file and line."""
    fleet, _, _ = _example()
    path = tmp_path / "p.csv"
    path.write_bytes(b"\xef\xbb\xbf# measured 2026-11\n#\njob_id,gpu,t_roll_s,t_train_s\n\na,H200,10,20\n"
                     b"b,H200,abc,20\n\n")
    with pytest.raises(TraceFormatError) as err:
        load_profiles(path, fleet)
    assert (err.value.line, err.value.column) == (6, "t_roll_s")
    path.write_bytes(b"\xef\xbb\xbfjob_id,gpu,t_roll_s,t_train_s\na,H200,10,0.0005\n")
    with pytest.raises(TraceFormatError) as err:
        load_profiles(path, fleet)
    assert (err.value.line, err.value.column) == (2, "t_train_s")
    path.write_bytes(b"\xef\xbb\xbfjob_id,gpu,t_roll_s,t_train_s\r\na,H200,10,20\r\n\r\n")
    assert load_profiles(path, fleet).table == {("a", "H200"): (10.0, 20.0)}
    path.write_bytes(b"job_id,gpu,t_roll_s,t_train_s\nj\xf6b,H200,10,20\n")
    with pytest.raises(TraceFormatError) as err:
        load_profiles(path, fleet)
    assert err.value.line == 2 and "not UTF-8" in str(err.value)


def test_profile_rows_a_run_never_reads_are_named_not_dropped_silently(tmp_path):
    fleet, _, jobs = _example()
    table = {(jobs[0].job_id, "H200"): (10.0, 20.0), ("ghost", "H200"): (1.0, 1.0),
             (jobs[1].job_id, "A100"): (5.0, 5.0)}
    lines = Profiles(table).unused(fleet, jobs)
    assert lines == ["1 job id(s) not in the trace: ghost", "GPU type(s) the fleet has no pool of: A100"]
    assert Profiles({(jobs[0].job_id, "H200"): (10.0, 20.0)}).unused(fleet, jobs) == []
    path = tmp_path / "p.csv"
    path.write_text("job_id,gpu,t_roll_s,t_train_s\nghost,H200,10,20\n")
    out = runner.invoke(app, ["fleet", "plan", "--jobs", str(EXAMPLE / "jobs.csv"), "--cluster",
                              str(EXAMPLE / "three_types.yaml"), "--profiles", str(path)])
    assert out.exit_code == 0 and "warning" in out.output and "ghost" in out.output, out.output


def test_fleet_commands_refuse_an_empty_trace_and_a_fleet_that_serves_nothing(tmp_path):
    """Each a clear error and exit 2, not a traceback (they were a ZeroDivisionError and
    an IndexError)."""
    empty = tmp_path / "empty.csv"
    empty.write_text("job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,"
                     "mem_train_gb,slo,model\n")
    out = runner.invoke(app, ["fleet", "plan", "--jobs", str(empty), "--cluster", str(EXAMPLE / "three_types.yaml")])
    assert out.exit_code == 2 and "holds no jobs" in out.output, out.output
    zero = tmp_path / "zero.yaml"
    zero.write_text("pools:\n  - {name: H20, gpu: H20, roles: [rollout], nodes: 0}\n"
                    "  - {name: H800, gpu: H800, roles: [train], nodes: 0}\n")
    for command in ("simulate", "plan"):  # (plan ran on it and printed a table of nothing)
        out = runner.invoke(app, ["fleet", command, "--jobs", str(EXAMPLE / "jobs.csv"), "--cluster", str(zero)])
        text = " ".join(out.output.split())
        assert out.exit_code == 2 and "a pool with the train role and nodes to train on" in text, out.output
    small, big = tmp_path / "small.yaml", tmp_path / "big.csv"  # nodes, but too few for the one job
    small.write_text("pools:\n  - {gpu: H20, nodes: 1}\n  - {gpu: H800, nodes: 1}\n")
    big.write_text(empty.read_text() + "big,0,3600,16,16,100,100,10,10,2,7B\n")
    out = runner.invoke(app, ["fleet", "simulate", "--jobs", str(big), "--cluster", str(small)])
    assert out.exit_code == 2 and "no policy can run this trace" in out.output, out.output


# --- phase times and translation ------------------------------------------------------
def test_phase_times_come_from_the_profile_then_the_trace_then_the_roofline_rule():
    fleet, profiles, jobs = _example()
    long_a = next(j for j in jobs if j.job_id == "long-a")
    assert profiles.phase_s(fleet, long_a, ROLLOUT, "H200") == (250.0, "profile")
    assert profiles.phase_s(fleet, long_a, ROLLOUT, "H20") == (620.0, "trace")
    assert profiles.phase_s(fleet, long_a, TRAIN, "H800") == (140.0, "trace")
    seconds, source = profiles.phase_s(fleet, long_a, TRAIN, "H200")
    assert source == "roofline" and seconds == pytest.approx(140.0)  # same TFLOPS as H800
    seconds, source = profiles.phase_s(fleet, long_a, ROLLOUT, "H800")
    assert source == "roofline" and seconds == pytest.approx(620.0 * 4.0 / 3.35)
    seconds, _ = profiles.phase_s(fleet, long_a, TRAIN, "H20")
    assert seconds == pytest.approx(140.0 * 989.5 / 148.0)
    measured = dataclasses.replace(long_a, t_roll_colo_s=500.0)
    assert profiles.phase_s(fleet, measured, ROLLOUT, "H800") == (500.0, "trace")


@settings(max_examples=60, deadline=None)
@given(roll=st.floats(10, 900), train=st.floats(10, 900), slo=st.floats(1.0, 3.0),
       view=st.integers(0, 8), staleness=st.sampled_from([0, 1]))
def test_translation_keeps_the_deadline_or_refuses_the_view(roll, train, slo, view, staleness):
    fleet, profiles, _ = _example()
    job = Job("j", roll, train, slo=slo, staleness=staleness, duration_s=50_000.0)
    v = fleet.views()[view]
    moved = translate(fleet, profiles, job, v)
    phases = (profiles.phase_s(fleet, job, ROLLOUT, v.rollout.gpu)[0], profiles.phase_s(fleet, job, TRAIN, v.train.gpu)[0])
    alone = max(phases) if staleness else sum(phases)
    if alone > slo * job.t_solo:
        assert moved is None
        return
    assert moved.slo * moved.t_solo == pytest.approx(slo * job.t_solo)
    assert moved.iterations == job.solo_iterations()
    assert moved.slo >= 1.0
    assert translate(fleet, profiles, dataclasses.replace(job, duration_s=None), v).iterations is None


def test_a_legacy_fleet_translates_every_job_to_itself():
    fleet = fleet_of(Cluster())
    view = fleet.views()[0]
    jobs, _ = load_trace("production", Cluster())
    for job in jobs[:50]:
        moved = translate(fleet, Profiles(), job, view)
        assert (moved.t_roll_s, moved.t_train_s, moved.slo) == (job.t_roll_s, job.t_train_s, job.slo)
        assert (moved.t_roll_colo_s, moved.t_train_colo_s) == (job.t_roll_colo_s, job.t_train_colo_s)


# --- the planner ------------------------------------------------------------------------
def _unprefixed(placement):
    """A fleet placement in a two-pool plan's ids: its view's prefix taken off the group id
    and the new nodes' local ids, and the physical nodes of pools ``rollout`` and ``train``
    (``rollout-3``) named as the plan names them (``R3``): both issue ids in order."""
    if placement is None:
        return None
    letter = {"rollout": "R", "train": "T"}
    strip = (lambda ids: tuple(i.split(":", 1)[1] if ":" in i else letter[i.split("-")[0]] + i.split("-")[1]
                               for i in ids))
    return dataclasses.replace(placement, group_id=placement.group_id and placement.group_id.split(":", 1)[1],
                               rollout_nodes=strip(placement.rollout_nodes), train_nodes=strip(placement.train_nodes),
                               new_rollout=strip(placement.new_rollout), new_train=strip(placement.new_train))


@pytest.mark.parametrize("space", [PAPER_SPACE, FULL_SPACE])
def test_on_a_two_pool_fleet_the_fleet_planner_decides_as_the_planner(space):
    jobs, _ = load_trace("production", Cluster())
    jobs = sorted(jobs[:60], key=lambda j: j.arrival_s)
    fleet_state, decisions = plan_jobs(FleetPlanner(fleet_of(Cluster()), space=space), jobs)
    planner, state = Planner(space=space), PlanState(Cluster())
    for job, fd in zip(jobs, decisions):
        d = planner.decide(state, job)
        assert fd.decision.outcome == d.outcome and _unprefixed(fd.decision.placement) == d.placement, job.job_id
        if d.placement is not None:
            state.apply(job, d.placement)
    assert fleet_state.cost_per_hour() == pytest.approx(state.cost_per_hour())
    assert fleet_state.effective_cost_per_hour() == pytest.approx(state.effective_cost_per_hour())


def _slos_hold(state) -> None:
    for name, (view, sub) in state.views.items():
        for g in sub.groups.values():
            a = analyze([sub.profile(m, g.colocated) for m in g.members])
            for m in g.members:
                original = state.originals[m.job.job_id]
                # the deadline on the reference types: iter_v <= SLO x T_solo_ref
                assert a.iteration_s[m.job.job_id] <= original.slo * original.t_solo * (1 + SLO_EPS) + 1e-6, \
                    (name, m.job.job_id)


def test_the_example_puts_each_job_on_the_types_its_profile_favours_and_keeps_every_slo():
    fleet, profiles, jobs = _example()
    state, decisions = plan_jobs(FleetPlanner(fleet, profiles), jobs)
    where = {d.job_id: state.views[d.view][0] for d in decisions}
    assert all(where[j].rollout.gpu == "H200" for j in ("long-a", "long-b", "long-c"))  # 2.5x faster decode
    assert all(where[j].train.gpu == "H200" for j in ("big-a", "big-b", "big-c"))  # no recomputation
    assert all(where[j].rollout.gpu == "H20" for j in ("short-a", "short-b", "short-c", "short-d"))  # roofline
    _slos_hold(state)


def test_a_bounded_pool_is_shared_by_every_view_that_uses_it():
    fleet, profiles, jobs = _example()
    pools = tuple(dataclasses.replace(p, nodes=1) if p.gpu == "H200" else p for p in fleet.pools)
    bounded = dataclasses.replace(fleet, pools=pools)
    state, decisions = plan_jobs(FleetPlanner(bounded, profiles), jobs)
    assert state.nodes_in_use("H200") <= 1
    assert all(d.view is not None for d in decisions)  # the rest found other types
    assert any("inventory" in v.reason for d in decisions for v in d.verdicts)


# --- the exact optimum and regrouping ----------------------------------------------------
def _small_fleet(rng: random.Random) -> Fleet:
    h200 = GPU_TYPES["H200"]
    return Fleet((FleetPool("H20", "H20", 1.85, 148.0, 4.0, 1024.0, roles=(ROLLOUT,)),
                  FleetPool("H800", "H800", 5.28, 989.5, 3.35, 1024.0),
                  FleetPool("H200", "H200", h200[2], h200[0], h200[1], 1024.0, roles=(TRAIN,))),
                 max_group_size=rng.choice([2, 3]))


def _random_jobs(rng: random.Random, n: int) -> tuple[list[Job], Profiles]:
    jobs, table = [], {}
    for i in range(n):
        jobs.append(Job(f"j{i}", float(rng.randint(30, 300)), float(rng.randint(30, 300)),
                        8, rng.choice([8, 8, 16]), mem_roll_gb=rng.choice([100.0, 400.0]),
                        mem_train_gb=rng.choice([100.0, 400.0]), slo=round(rng.uniform(1.0, 2.2), 3),
                        model="7B", arrival_s=float(i)))
        if rng.random() < 0.5:
            table[(f"j{i}", "H200")] = (None, round(jobs[-1].t_train_s * rng.uniform(0.4, 1.1), 1))
    return jobs, Profiles(table)


def _fleet_brute_force(fleet: Fleet, profiles: Profiles, jobs: list[Job], space) -> float:
    colocating = {fleet.colocation_view(p) for p in fleet.pools}

    def block(members: list[Job]) -> float:
        best = float("inf")
        for view in fleet.views():
            moved = [translate(fleet, profiles, j, view) for j in members]
            if any(m is None for m in moved):
                continue
            sigma = sum(m.t_solo / j.t_solo for j, m in zip(members, moved)) / len(members)
            here = dataclasses.replace(space, colocation=space.colocation and view.name in colocating)
            best = min(best, sigma * _block_cost(view.cluster, moved, here))
        return best

    return cheapest_partition(sorted(jobs, key=lambda j: j.arrival_s), block, key=lambda j: j.job_id)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 3), full=st.booleans())
def test_the_fleet_optimum_matches_a_brute_force_over_views_and_partitions(seed, n, full):
    rng = random.Random(seed)
    fleet = _small_fleet(rng)
    jobs, profiles = _random_jobs(rng, n)
    # the brute force checks the analysed steady state only, so the solver does too
    space = dataclasses.replace(FULL_SPACE if full else PAPER_SPACE, all_starts=False)
    solution = solve_fleet(fleet, jobs, profiles, space, robust=True)
    assert solution.objective == pytest.approx(_fleet_brute_force(fleet, profiles, jobs, space), rel=1e-9)
    assert solution.state.effective_cost_per_hour() == pytest.approx(solution.objective, rel=1e-9)
    _slos_hold(solution.state)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 5))
def test_the_fleet_planner_and_its_regrouping_never_beat_the_optimum_and_regrouping_never_costs(seed, n):
    rng = random.Random(seed)
    fleet = _small_fleet(rng)
    jobs, profiles = _random_jobs(rng, n)
    optimum = solve_fleet(fleet, jobs, profiles, PAPER_SPACE).objective
    state, _ = plan_jobs(FleetPlanner(fleet, profiles), jobs)
    greedy = state.effective_cost_per_hour()
    result = improve_fleet(state, PAPER_SPACE)
    assert optimum <= result.cost_after * (1 + 1e-9) <= greedy * (1 + 1e-9) + 1e-9
    assert state.effective_cost_per_hour() == pytest.approx(result.cost_after)
    assert sorted(state.originals) == sorted(j.job_id for j in jobs)
    _slos_hold(state)


def test_on_a_two_pool_fleet_the_optimum_is_the_exact_solver_s():
    jobs, _ = load_trace("production", Cluster())
    for space in (PAPER_SPACE, FULL_SPACE):
        ours = solve_fleet(fleet_of(Cluster()), jobs[:7], space=space).objective
        assert ours == pytest.approx(solve(Cluster(), jobs[:7], space=space).objective, rel=1e-12)


def test_confined_to_one_view_the_optimum_is_never_cheaper_than_on_the_whole_fleet():
    fleet, profiles, jobs = _example()
    whole = solve_fleet(fleet, jobs[:6], profiles).objective
    for view in ("H20/H800", "H200/H200"):
        assert solve_fleet(fleet, jobs[:6], profiles, only=(view,)).objective >= whole * (1 - 1e-12)


# --- baselines and the savings ------------------------------------------------------------
def test_the_fleet_plan_beats_every_fixed_type_assignment_and_every_baseline_on_the_example():
    fleet, profiles, jobs = _example()
    planner = FleetPlanner(fleet, profiles)
    rows = alternatives(planner, jobs, lambda s: improve_fleet(s))
    ours = rows[0]
    assert ours.kind == "fleet" and not ours.misses
    others = [r for r in rows[1:] if not r.misses]
    assert {r.kind for r in others} == {"fixed-view", "solo-d", "co-located", "gavel+"}
    assert all(ours.effective_cost < r.effective_cost for r in others)
    best_fixed = min(r.effective_cost for r in others if r.kind == "fixed-view")
    assert ours.effective_cost < 0.95 * best_fixed  # the type choice is worth more than noise here
    # H20 cannot train any of these jobs within its SLO (6.7x fewer TFLOPS than H800)
    assert all(len(r.misses) == len(jobs) for r in rows if r.name.endswith("/H20") or r.name.endswith("on H20"))


def test_alternatives_report_each_plan_as_it_is_done():
    """``rollmux fleet plan``'s progress: one step per plan (the fleet's, then each view's),
    each after its regrouping, in order."""
    fleet, profiles, jobs = _example()
    seen, regrouped = [], []
    alternatives(FleetPlanner(fleet, profiles), jobs, lambda s: regrouped.append(len(seen)),
                 progress=seen.append)
    assert seen == list(range(1, 2 + len(fleet.views())))
    assert regrouped == list(range(len(seen)))  # each plan regrouped before its step
    # the fleet plan the command made already is used as it is, not planned again
    planner = FleetPlanner(fleet, profiles)
    state, decisions = plan_jobs(planner, jobs)
    improve_fleet(state)
    again = []
    rows = alternatives(planner, jobs, lambda s: again.append(improve_fleet(s)), planned=(state, decisions))
    assert len(again) == len(fleet.views())
    assert rows == alternatives(planner, jobs, lambda s: improve_fleet(s))


def test_baselines_on_bounded_pools_serve_only_the_jobs_whose_nodes_the_pools_hold():
    """Every job is present at once, so a no-sharing baseline on bounded pools serves the
    jobs, in trace order, while their nodes last: no pool is over-committed, every job it
    misses meets its SLO there only on nodes that are gone, and gavel+ falls back to a
    job's next-cheapest option that still fits (the rows priced 10 solo-d jobs on 4 H800
    nodes). Unbounded, each row is the plain sum of the feasible options."""
    fleet, profiles, jobs = _example()
    bounded = load_fleet(EXAMPLE / "three_types_bounded.yaml")
    inventory = {p.name: p.nodes for p in bounded.pools}
    options = {j.job_id: alone_options(bounded, profiles, j) for j in jobs}
    rows = {r.name: r for r in alternatives(FleetPlanner(bounded, profiles), jobs)}
    for name, row in rows.items():
        if row.kind not in ("solo-d", "co-located", "gavel+"):
            continue
        used = dict.fromkeys(inventory, 0)
        cost = 0.0
        for job in jobs:
            mine = sorted(options[job.job_id], key=lambda o: o.effective_cost) if row.kind == "gavel+" \
                else [o for o in options[job.job_id] if o.name == name]
            fits = [o for o in mine if o.feasible and all(used[p] + n <= inventory[p] for p, n in o.nodes)]
            assert (job.job_id in row.misses) == (not fits), (name, job.job_id)
            if fits:
                cost += fits[0].effective_cost
                for pool, n in fits[0].nodes:
                    used[pool] += n
        assert all(used[p] <= inventory[p] for p in inventory), name
        assert row.effective_cost == pytest.approx(cost), name
    solo = rows["solo-d on H20/H800"]
    assert 0 < len(solo.misses) < len(jobs)  # 4 H800 nodes hold 4 one-node jobs, not 10
    assert sum(n for j in jobs if j.job_id not in solo.misses
               for o in options[j.job_id] if o.name == solo.name for p, n in o.nodes if p == "H800") <= 4
    unbounded = {r.name: r for r in alternatives(FleetPlanner(fleet, profiles), jobs)}
    for name in ("solo-d on H20/H800", "co-located on H800"):
        feasible = [o for j in jobs for o in alone_options(fleet, profiles, j) if o.name == name and o.feasible]
        assert unbounded[name].effective_cost == pytest.approx(sum(o.effective_cost for o in feasible))
        assert len(unbounded[name].misses) == len(jobs) - len(feasible)


def test_fleet_plan_refuses_optimal_on_bounded_pools_before_planning():
    out = runner.invoke(app, ["fleet", "plan", "--optimal", "--jobs", str(EXAMPLE / "jobs.csv"),
                              "--cluster", str(EXAMPLE / "three_types_bounded.yaml")])
    assert out.exit_code == 2 and "bounded" in out.output and "groups and their GPU types" not in out.output, \
        out.output


def test_gavel_takes_each_job_s_cheapest_feasible_alone_option():
    fleet, profiles, jobs = _example()
    rows = alternatives(FleetPlanner(fleet, profiles), jobs)
    alone = [r for r in rows if r.kind in ("solo-d", "co-located")]
    gavel = next(r for r in rows if r.kind == "gavel+")
    assert gavel.effective_cost <= min(r.effective_cost for r in alone if not r.misses) + 1e-9


# --- the roofline rule against the production trace -------------------------------------------
def test_the_roofline_check_reports_the_trace_s_own_errors():
    jobs, _ = load_trace("production", None)
    check = roofline_check(jobs, fleet_of(Cluster()), ROLLOUT)
    errors = [j.t_roll_s * 4.0 / 3.35 / j.t_roll_colo_s - 1 for j in jobs]
    assert check.rows == 200
    assert check.worst == pytest.approx(max(errors, key=abs))
    assert check.mean_abs == pytest.approx(sum(abs(e) for e in errors) / len(errors))
    assert check.by_model["7B_8k"] == pytest.approx(0.0, abs=0.01)
    with pytest.raises(SpecError):
        roofline_check([Job("x", 1.0, 1.0)], fleet_of(Cluster()), TRAIN)


# --- the command ----------------------------------------------------------------------------------
def _on_example(command: str, *extra: str):
    """``rollmux fleet <command>`` on the three-type example."""
    return runner.invoke(app, ["fleet", command, "--jobs", str(EXAMPLE / "jobs.csv"), "--cluster",
                               str(EXAMPLE / "three_types.yaml"), "--profiles", str(EXAMPLE / "profiles.csv"), *extra])


def test_fleet_plan_prints_the_type_choices_and_the_saving_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    result = _on_example("plan", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "best fixed-type assignment" in result.output and "% less" in result.output
    data = json.loads(out.read_text())
    gpus = {j: (g["rollout_gpu"], g["train_gpu"]) for g in data["groups"] for j in g["jobs"]}
    moved = [gid for move in data["improvement"] for side in ("before", "after") for gid in move[side]]
    assert moved and all(re.fullmatch(r"[^:]+/[^:]+:g\d+", gid) for gid in moved)  # '<view>:g<n>', once
    assert gpus["long-a"][0] == "H200" and gpus["big-a"][1] == "H200"
    assert data["effective_cost_per_hour"] < min(a["effective_cost_per_hour"] for a in data["alternatives"]
                                                 if a["kind"] == "fixed-view" and not a["misses"])
    assert sorted(j for g in data["groups"] for j in g["jobs"]) == sorted(j.job_id for j in read_trace(
        EXAMPLE / "jobs.csv"))


def test_fleet_plan_names_a_bad_field_and_changes_nothing(tmp_path):
    bad = tmp_path / "f.yaml"
    bad.write_text("pools:\n  - {gpu: H20}\n  - {gpu: H800, tb_per_s: fast}\n")
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["fleet", "plan", "--jobs", str(EXAMPLE / "jobs.csv"), "--cluster", str(bad),
                                 "--json", str(out)])
    assert result.exit_code == 2 and "pools[1].tb_per_s" in result.output
    assert not out.exists()


def test_fleet_plan_refuses_workers_with_an_address_before_planning(tmp_path):
    out = tmp_path / "plan.json"
    result = _on_example("plan", "--workers", "2", "--address", "auto", "--json", str(out))
    assert result.exit_code == 2 and "--workers sizes a local Ray instance" in result.output
    assert not out.exists()


def test_fleet_roofline_prints_the_error_per_model():
    result = runner.invoke(app, ["fleet", "roofline"])
    assert result.exit_code == 0, result.output
    assert "8B_32k" in result.output and "median |error|" in result.output


# --- the simulator on a fleet ------------------------------------------------------------------
@pytest.mark.parametrize("space, policy", [(PAPER_SPACE, "rollmux"), (FULL_SPACE, "rollmux-full")])
def test_on_a_two_pool_fleet_the_simulator_replays_exactly_as_on_the_cluster(space, policy):
    jobs, _ = load_trace("production", Cluster())
    fleet = fleet_of(Cluster())
    ours = simulate(jobs, fleet.views()[0].cluster, FleetRollMux(fleet, Profiles(), space))
    theirs = simulate(jobs, Cluster(), make_policy(policy))
    assert ours.total_cost == pytest.approx(theirs.total_cost, rel=1e-12)
    assert ours.slo_attainment == theirs.slo_attainment
    assert [j.slowdown for j in ours.jobs] == pytest.approx([j.slowdown for j in theirs.jobs], rel=1e-12)


@pytest.mark.parametrize("name, space, nodes", [("rollmux-regroup", PAPER_SPACE, None),
                                                ("rollmux-full-regroup", FULL_SPACE, None),
                                                ("rollmux-full-regroup", FULL_SPACE, 4)])
def test_on_a_two_pool_fleet_regrouping_replays_exactly_as_on_the_cluster(name, space, nodes):
    """One view: the fleet's regrouping is the two-pool one (after arrivals too in the full
    space, and on 4 + 4 nodes at each refusal of the waiting line's head too), without
    consolidation, which the fleet policies do not offer."""
    jobs = generate(16, seed=3, mean_interarrival_s=900.0, mean_duration_s=20_000.0)
    cluster = Cluster()
    if nodes:
        cluster = dataclasses.replace(cluster, rollout=dataclasses.replace(cluster.rollout, nodes=nodes),
                                      train=dataclasses.replace(cluster.train, nodes=nodes))
    fleet = fleet_of(cluster)
    policy = fleet_rollmux(fleet, Profiles(), name)
    assert policy.regroup_on_wait == space.colocation
    ours = simulate(jobs, fleet.views()[0].cluster, policy)
    theirs = simulate(jobs, cluster, RollMuxPolicy(name=name, regroup=True, space=space))
    if nodes:
        assert any(o.placed_s > o.arrival_s for o in ours.jobs), "the cluster must make jobs queue"
    assert ours.outcomes["regrouped"] >= 1 and ours.outcomes == theirs.outcomes
    assert ours.total_cost == pytest.approx(theirs.total_cost, rel=1e-12)
    assert [j.slowdown for j in ours.jobs] == pytest.approx([j.slowdown for j in theirs.jobs], rel=1e-12)


def test_a_lone_job_moves_to_another_pair_of_types_only_when_its_remaining_dollars_fall():
    """``plan_fleet_regroup`` step 2: a job left alone in an H20/H800 group whose H200
    co-location costs less per iteration moves there with many iterations left, not with
    too few to pay for the pause, and on a bounded fleet only onto free nodes."""
    fleet = load_fleet(EXAMPLE / "three_types.yaml")
    job = Job("a", 100.0, 100.0, slo=2.0, iterations=1000)
    state = FleetState(fleet, Profiles({("a", "H200"): (40.0, 60.0)}))  # H200 2.5x / 1.7x faster
    state.apply(job, Placement(None, ("H20/H800:R0",), ("H20/H800:T0",), ("H20/H800:R0",), ("H20/H800:T0",)))
    (gid,) = state.groups
    alone = solve_fleet(fleet, [job], state.profiles, FULL_SPACE, robust=True)
    (target,) = [name for name, (_, sub) in alone.state.views.items() if sub.groups]
    assert target != "H20/H800"

    def plan(left: int, spare: float, pause: float = 400.0):
        return plan_fleet_regroup(state, gid, lambda k: (left, spare), lambda k: pause, FULL_SPACE)

    moved = plan(900, 1e9)
    assert moved is not None and moved.view == target and moved.replaced == (gid,)
    assert [m.job.job_id for g in moved.groups for m in g.members] == ["a"]
    assert plan(1, 1e9) is None  # one iteration left does not pay for the pause
    (new_gid,) = alone.state.groups
    iteration = alone.state.analysis(new_gid).iteration_s["a"]
    assert plan(900, 900 * iteration + 1e5) is not None
    assert plan(900, 900 * iteration + 300.0) is None  # no spare seconds for the pause within its SLO
    assert plan_fleet_regroup(state, gid, lambda k: None, lambda k: 400.0, FULL_SPACE) is None  # cannot move now
    # bounded pools: the move needs free nodes of the pools of its pair of types (the group
    # it leaves holds none of them)
    for h200, moves in ((4, True), (0, False)):
        pools = tuple(dataclasses.replace(p, nodes=h200 if p.gpu == "H200" else 4) for p in fleet.pools)
        bounded = FleetState(dataclasses.replace(fleet, pools=pools), state.profiles)
        bounded.apply(job, Placement(None, ("H20/H800:R0",), ("H20/H800:T0",), ("H20/H800:R0",), ("H20/H800:T0",)))
        got = plan_fleet_regroup(bounded, next(iter(bounded.groups)), lambda k: (900, 1e9), lambda k: 400.0,
                                 FULL_SPACE)
        assert (got.view if got else None) == (target if moves else None)


def test_on_the_example_fleet_rollmux_full_is_the_cheapest_replay_at_every_slo():
    fleet, profiles, jobs = _example()
    results = []
    for policy in fleet_policies(fleet, profiles):
        try:
            results.append(simulate(jobs, fleet.views()[0].cluster, policy))
        except CapacityError:
            assert policy.name.endswith("/H20")  # nothing trains on H20 within an SLO
    n = len(FLEET_ROLLMUX)
    assert [r.policy for r in results[:n]] == list(FLEET_ROLLMUX)
    ours = results[1]
    assert ours.slo_attainment == 1.0 and not ours.rejected
    served = [r for r in results if r.slo_attainment == 1.0]
    assert {r.policy for r in served} >= {"gavel+", "co-located on H200", "rollmux on H20/H800", "rollmux"}
    assert all(ours.total_cost < r.total_cost for r in results[n:])
    # here the lifetime objective chooses what the rate rule chooses, in both spaces
    assert [r.total_cost for r in results[2:4]] == pytest.approx([results[0].total_cost, ours.total_cost])
    # regrouping: none in the paper space here; in the full one a move that lowers the bill, every SLO met
    assert results[4].total_cost == pytest.approx(results[0].total_cost) and not results[4].outcomes["regrouped"]
    full_regroup = results[5]
    assert full_regroup.outcomes["regrouped"] >= 1 and full_regroup.slo_attainment == 1.0
    assert full_regroup.total_cost < ours.total_cost
    # without co-location RollMux cannot imitate Gavel+'s H200 co-location here, and costs more
    gavel = next(r for r in results if r.policy == "gavel+")
    assert results[0].total_cost > gavel.total_cost
    # a phase runs for its time on its group's types: the slowest types make the longest runs
    slow = next(r for r in results if r.policy == "solo-d on H20/H20")
    assert slow.slo_attainment == 0.0 and slow.span_s > 4 * ours.span_s


def test_fleet_simulate_names_why_a_policy_placed_no_job_a_type_with_no_nodes(tmp_path):
    """A type with no nodes: its views place no job because its pool is empty, which the
    output says (it said "too slow for every SLO on those types", and "rollout.nodes =
    None" for a fleet's view); each job is rejected, naming the pool, not left waiting
    for nodes the pool never has."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gpus_per_node: 8\nreference: {rollout: H20, train: H800}\n"
                     "pools:\n  - {gpu: H20, nodes: 0}\n  - {gpu: H800, nodes: 4}\n")
    out = tmp_path / "sim.json"
    result = runner.invoke(app, ["fleet", "simulate", "--jobs", str(EXAMPLE / "jobs.csv"), "--cluster", str(fleet),
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert "solo-d on H20/H800" in data["serve_no_job"]
    assert "needs 1 H20 nodes, the pool has 0" in data["no_job_reasons"]["solo-d on H20/H800"]
    text = " ".join(result.output.split())
    listed = text.split("placed no job, so not in the table:")[1]
    assert "solo-d on H20/H800: " in listed and "needs 1 H20 nodes, the pool has 0" in listed
    assert "still waiting" not in listed
    assert "too slow for every SLO" not in text and "nodes = None" not in text


def test_gavel_over_types_runs_each_job_on_its_cheapest_option_that_meets_its_slo():
    fleet, profiles, jobs = _example()
    result = simulate(jobs, fleet.views()[0].cluster, FleetAlone(fleet, profiles, "gavel+", gavel=True))
    assert result.slo_attainment == 1.0
    for job in jobs:
        options = [o for o in alone_options(fleet, profiles, job) if o.feasible]
        best = min(options, key=lambda o: o.effective_cost)
        placed = next(j for j in result.jobs if j.job_id == job.job_id)
        assert placed.group_id.split(":", 1)[0] == best.view, job.job_id


def test_fleet_simulate_prints_every_policy_and_writes_json(tmp_path):
    out = tmp_path / "sim.json"
    result = _on_example("simulate", "--json", str(out), "--plot", str(tmp_path / "plots" / "cost.png"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "plots" / "cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the views that place no job are listed with a job's reason (training on H20 is too slow for any SLO)
    assert "gavel+" in result.output and "placed no job" in result.output
    listed = " ".join(result.output.split()).split("placed no job, so not in the table:")[1]
    assert "rollmux on H20/H20: short-a: no view can take it (H20/H20: slower than its SLO even alone" in listed
    data = json.loads(out.read_text())
    ours = data["policies"]["rollmux-full"]
    assert ours["slo_attainment"] == 1.0
    assert all(ours["total_cost"] < p["total_cost"] for name, p in data["policies"].items() if name not in FLEET_ROLLMUX)
    assert data["policies"]["rollmux-full-lifetime"]["total_cost"] == pytest.approx(ours["total_cost"])
    assert "cheaper than rollmux at no fewer SLOs: rollmux-full, rollmux-full-lifetime, rollmux-full-regroup" in " ".join(
        result.output.split())


def test_fleet_cost_splits_by_placement_and_gpu_types():
    """Each kind names its view; the kinds add up to the replay's node cost at each view's prices,
    and the jobs under each view are the jobs placed there."""
    fleet, profiles, jobs = _example()
    result = simulate(jobs, fleet.views()[0].cluster, FleetRollMux(fleet, profiles, FULL_SPACE))
    split = result.cost_by_placement
    assert math.isclose(sum(k["cost"] for k in split.values()), result.used_cost, rel_tol=1e-9)
    # the GPU-seconds each fleet pool held, at its price, are the same node cost
    price = {p.name: p.price_per_gpu_hour for p in fleet.pools}
    assert set(result.pool_gpu_seconds) == set(price)
    assert math.isclose(sum(s * price[p] / 3600 for p, s in result.pool_gpu_seconds.items()), result.used_cost,
                        rel_tol=1e-9)
    views = {v.name for v in fleet.views()}
    per_view: dict[str, int] = {}
    for kind, k in split.items():
        outcome, view = kind.split(" on ", 1)
        assert view in views and outcome in result.outcomes
        per_view[view] = per_view.get(view, 0) + k["jobs"]
    placed: dict[str, int] = {}
    for j in result.jobs:
        view = j.group_id.split(":", 1)[0]
        placed[view] = placed.get(view, 0) + 1
    assert per_view == placed
    printed = _on_example("simulate")
    assert printed.exit_code == 0, printed.output
    assert "rollmux-full cost by placement: " in printed.output and " on H20/H200 " in printed.output
    # and the cheapest RollMux policy's split (rollmux-hedge here), with the jobs it paired or moved
    flat = " ".join(printed.output.split())
    assert "rollmux-hedge cost by placement: " in flat and "regrouped on H200/H200 " in flat


def test_a_replay_on_bounded_pools_never_holds_more_nodes_than_a_pool_has():
    fleet, profiles, jobs = _example()
    bounds = {"H20": 6, "H800": 4, "H200": 3}
    bounded = dataclasses.replace(fleet, pools=tuple(dataclasses.replace(p, nodes=bounds[p.name]) for p in fleet.pools))

    class Checked(FleetState):
        def apply(self, job, placement):
            gid = super().apply(job, placement)
            assert all(self.nodes_in_use(pool) <= bound for pool, bound in bounds.items()), job.job_id
            return gid

    results = {}
    for policy in (FleetRollMux(bounded, profiles, FULL_SPACE), FleetAlone(bounded, profiles, "gavel+", gavel=True)):
        policy.new_state = lambda policy=policy: Checked(bounded, profiles, getattr(policy, "only", ()))
        results[policy.name] = simulate(jobs, bounded.views()[0].cluster, policy)
    ours, gavel = results["rollmux"], results["gavel+"]
    assert ours.slo_basis == "end-to-end" and ours.bounded == ("H20", "H800", "H200")
    assert ours.slo_attainment == 1.0 and not ours.rejected
    assert gavel.slo_attainment < 1.0 and gavel.mean_wait_s > 0  # alone, the jobs queue for H200 nodes
def test_fleet_plan_explains_every_view_and_its_candidates():
    result = _on_example("plan", "--explain", "--no-improve")
    assert result.exit_code == 0, result.output
    block = result.output.split("short-b ->", 1)[1].split("short-c ->", 1)[0]
    assert "H20/H20:  slower than its SLO even alone" in block  # a view skipped, and why
    assert "H200/H200: +$" in block and "costlier" in block  # a view's offer, and why not taken
    assert "pack H20/H800:g0" in block and "chosen" in block  # the chosen view's own candidates


def test_on_several_views_joining_a_group_is_charged_at_the_members_iterations():
    fleet, profiles, jobs = _example()
    planner = FleetPlanner(fleet, profiles)
    assert planner.sharing_cost and not FleetPlanner(fleet_of(Cluster())).sharing_cost
    state, _ = plan_jobs(planner, jobs[:1])
    decision = planner.decide(state, jobs[1])  # short-b packs with short-a on H20/H800
    assert decision.decision.outcome == "packed"
    view, sub = state.views[decision.view]
    group = sub.groups[decision.decision.placement.group_id]
    moved = translate(fleet, profiles, jobs[1], view)
    before = sub.analysis(group.group_id).iteration_s
    after = analyze([*sub.view(group.group_id).profiles, sub.profile(
        Member(moved, decision.decision.placement.rollout_nodes, decision.decision.placement.train_nodes))]).iteration_s
    solo = {"short-a": jobs[0].t_solo, "short-b": jobs[1].t_solo}
    price = group.cost_per_hour(view.cluster)
    expected = price * (sum(after[k] / solo[k] for k in after) / 2 - before["short-a"] / solo["short-a"])
    assert decision.effective_cost == pytest.approx(expected) and expected > 0  # sharing is not free


def test_fleet_commands_run_on_a_builtin_trace_without_profiles(tmp_path):
    jobs, _ = load_trace("production", Cluster())
    trace = tmp_path / "few.csv"
    write_trace(jobs[:12], trace)
    for command in ("plan", "simulate"):
        result = runner.invoke(app, ["fleet", command, "--jobs", str(trace),
                                     "--cluster", str(EXAMPLE / "three_types.yaml")])
        assert result.exit_code == 0, result.output
        assert "rollmux" in result.output


def test_an_asynchronous_job_on_a_fleet_runs_alone_and_keeps_its_slo():
    fleet, profiles, jobs = _example()
    pipelined = dataclasses.replace(next(j for j in jobs if j.job_id == "long-a"), staleness=1)
    trace = [pipelined if j.job_id == "long-a" else j for j in jobs]
    for space in (PAPER_SPACE, FULL_SPACE):
        state, decisions = plan_jobs(FleetPlanner(fleet, profiles, space=space), trace)
        group = state.groups[state.job_group["long-a"]]
        assert [m.job.job_id for m in group.members] == ["long-a"]  # asynchronous jobs share no group
        assert group.members[0].job.t_solo == max(group.members[0].job.t_roll_s, group.members[0].job.t_train_s)
        result = simulate(trace, fleet.views()[0].cluster, FleetRollMux(fleet, profiles, space))
        assert result.slo_attainment == 1.0
        assert next(j for j in result.jobs if j.job_id == "long-a").slowdown <= pipelined.slo


def test_fleet_simulate_takes_the_waiting_lines_order(tmp_path):
    """On bounded pools ``--queue fifo`` keeps the line strictly in order (a job that packs
    waits behind the head); the default lets it pass."""
    from test_queue_backfill import _line

    from rollmux.traces.format import write_trace

    trace, fleet_file = tmp_path / "line.csv", tmp_path / "fleet.yaml"
    write_trace([dataclasses.replace(j, model="7B") for j in _line()], trace)
    fleet_file.write_text("pools:\n  - {gpu: H20, nodes: 2}\n  - {gpu: H800, nodes: 2}\nswitch_cost_s: 0\n")
    summaries = {}
    for queue in ("backfill", "fifo"):
        out = tmp_path / f"{queue}.json"
        result = runner.invoke(app, ["fleet", "simulate", "--jobs", str(trace), "--cluster", str(fleet_file),
                                     "--queue", queue, "--json", str(out)])
        assert result.exit_code == 0, result.output
        assert f"(the line: {queue})" in " ".join(result.output.split())
        data = json.loads(out.read_text())
        assert data["queue"] == queue
        summaries[queue] = data["policies"]["rollmux"]
    # `small` passes `big` only under backfill (and `big`, behind a longer group, waits longer)
    assert summaries["fifo"]["mean_wait_s"] != summaries["backfill"]["mean_wait_s"]
    assert summaries["backfill"]["placements"].get("backfilled") and not summaries["fifo"]["placements"].get(
        "backfilled")


def test_a_pool_name_with_control_characters_is_refused():
    with pytest.raises(SpecError, match="control characters"):
        fleet_from_dict({"reference": {"rollout": "H20", "train": "H800"},
                         "pools": [{"gpu": "H20", "name": "x\x1b[2J"}, {"gpu": "H800"}]})


def test_a_gpu_type_of_the_fleets_own_runs_the_regrouping_policies_too(tmp_path):
    """(an auditor's case) a pool of a type outside the built-in table, its figures given
    (docs/fleet.md): ``fleet plan`` and plain ``rollmux`` ran, but every regrouping policy
    ended in a traceback, the exact solver refusing the view's GPU type."""
    from rollmux.policies.fleet import fleet_rollmux
    from rollmux.sim.engine import simulate as replay
    from rollmux.traces.format import read_trace

    fleet = fleet_from_dict({"pools": [{"gpu": "H20", "nodes": 6},
                                       {"gpu": "X9000", "nodes": 4, "price_per_gpu_hour": 3.0, "tflops": 900.0,
                                        "tb_per_s": 3.0, "host_mem_gb": 2048.0}]})
    jobs = read_trace(Path(__file__).parents[1] / "examples" / "fleet" / "jobs.csv")
    for name in ("rollmux-regroup", "rollmux-hedge"):
        result = replay(jobs, fleet.views()[0].cluster, fleet_rollmux(fleet, Profiles(), name))
        assert result.total_cost > 0 and not result.rejected, name
    with pytest.raises(SpecError, match="train.gpu"):  # a two-pool cluster file still names a known type
        next(v for v in fleet.views() if v.train.gpu == "X9000").cluster.validate()


def test_fleet_simulate_runs_only_the_policies_asked_for(tmp_path):
    """(every policy always ran: rollmux-full-regroup alone took many minutes on 1,000 jobs)"""
    out = tmp_path / "sim.json"
    result = runner.invoke(app, ["fleet", "simulate", "--jobs", str(EXAMPLE / "jobs.csv"), "--policies",
                                 "gavel+, rollmux-hedge", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert list(json.loads(out.read_text())["policies"]) == ["rollmux-hedge", "gavel+"]  # (table order)
    assert "x rollmux-hedge" in result.output
    result = runner.invoke(app, ["fleet", "simulate", "--jobs", str(EXAMPLE / "jobs.csv"), "--policies", "gavel"])
    assert result.exit_code == 2 and "--policies='gavel': expected names among rollmux, " in " ".join(
        result.output.split())


def test_two_pools_of_one_type_with_other_figures_are_refused_naming_the_second():
    """(an audit's case) pools H200-slow (100 TFLOPS, 1 TB/s) and H200-fast (the table's) got
    one set of phase times, the last pool's in the file: phase times are per GPU type
    (profiles, the trace's reference columns, the roofline rule). Refused, naming the
    second pool's field; one type in several pools at one set of figures, and a slower
    GPU as a type of its own, still plan."""
    slow = {"gpu": "H200", "name": "H200-slow", "tflops": 100.0, "tb_per_s": 1.0}
    for second, field in (({"gpu": "H200", "name": "fast"}, "pools[3].tflops"),
                          ({"gpu": "H200", "name": "fast", "tflops": 100.0}, "pools[3].tb_per_s")):
        with pytest.raises(SpecError) as err:
            fleet_from_dict({"pools": [{"gpu": "H20"}, {"gpu": "H800"}, slow, second]})
        assert err.value.field == field and "of pool 'H200-slow' of GPU type 'H200'" in err.value.expected
    shared = fleet_from_dict({"pools": [{"gpu": "H20"}, {"gpu": "H800"}, {"gpu": "H200", "nodes": 2},
                                        {"gpu": "H200", "name": "H200-spot", "price_per_gpu_hour": 3.0}]})
    assert shared.figures()["H200"] == GPU_TYPES["H200"][:2]
    own = fleet_from_dict({"pools": [{"gpu": "H20"}, {"gpu": "H800"}, {"gpu": "H200"},
                                     {"gpu": "H200-slow", "tflops": 100.0, "tb_per_s": 1.0,
                                      "price_per_gpu_hour": 3.0}]})
    job = read_trace(EXAMPLE / "jobs.csv")[0]
    times = {v.name: translate(own, Profiles(), job, v, strict=False) for v in own.views()}
    fast, slower = times["H200/H200"], times["H200-slow/H200-slow"]
    assert fast.t_roll_s == pytest.approx(job.t_roll_s * 4.0 / 4.8)
    assert slower.t_roll_s == pytest.approx(job.t_roll_s * 4.0 / 1.0)
    assert slower.t_train_s == pytest.approx(job.t_train_s * GPU_TYPES["H800"][0] / 100.0)


def test_fleet_plan_optimal_says_its_job_limit_as_an_option_would():
    """(an audit's case) it said "raise max_jobs to insist", which no option of the command sets."""
    out = runner.invoke(app, ["fleet", "plan", "--optimal", "--jobs", "production", "--cluster",
                              str(EXAMPLE / "three_types.yaml")])
    assert out.exit_code == 2, out.output
    said = " ".join(out.output.split())
    assert "--optimal solves at most 12 jobs (the search grows like 3^n); --jobs production holds 200" in said
    assert "max_jobs" not in said and "groups and their GPU types" not in said


def test_the_chosen_view_s_verdict_says_chosen():
    """(an audit's case) --explain left the chosen view's verdict blank ('reason': '' in the
    JSON) while every other view said why it was not taken."""
    fleet, profiles, jobs = _example()
    _, decisions = plan_jobs(FleetPlanner(fleet, profiles), jobs, explain=True)
    for d in decisions:
        verdicts = {v.view: v.reason for v in d.verdicts}
        assert verdicts[d.view].startswith("chosen")
        assert all(reason and not reason.startswith("chosen") for view, reason in verdicts.items() if view != d.view)
        assert [v["reason"] for v in d.to_dict()["views"] if v["view"] == d.view][0].startswith("chosen")
    result = _on_example("plan", "--explain", "--no-improve")
    assert result.exit_code == 0, result.output
    block = result.output.split("short-b ->", 1)[1].split("short-c ->", 1)[0]
    assert re.search(r"H20/H800: \+\$[\d.]+/h chosen\n", block)
