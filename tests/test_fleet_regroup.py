"""Plan-time regrouping on a fleet (``fleet_exact.improve_fleet``) re-solves a lone group too.

An audit's case (instance 29 of seed 2 of ``benchmarks/fleet_vs_exact.py``'s draw, full
space, on the three-type fleet): the greedy plan puts both jobs in one H20/H200 group at
$94.57/h effective; the optimum co-locates each on H200, $76.78/h. Regrouping tried sets
of two groups or more only, so a plan of one group was never improved (0 regroupings,
0 exact solves) and ``fleet plan`` printed 23.2% more than the best fixed-type plan.
"""
from __future__ import annotations


import pytest
import yaml
from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.fleet import Profiles, fleet_of
from rollmux.fleet_exact import improve_fleet, solve_fleet
from rollmux.fleet_file import fleet_from_dict
from rollmux.fleet_planner import FleetPlanner, plan_jobs
from rollmux.model import Cluster
from rollmux.planner import FULL_SPACE
from rollmux.traces.format import read_trace

FLEET = {"gpus_per_node": 8, "reference": {"rollout": "H20", "train": "H800"},
         "pools": [{"gpu": "H20"}, {"gpu": "H800"}, {"gpu": "H200"}], "switch_cost_s": "warm", "max_group_size": 5}
TRACE = """job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,mem_train_gb,slo,model,\
iterations
j0,0,,8,8,215.49216361983798,229.53126449531405,113.4,156.2,1.1199048088349077,3B,200
j1,1,,8,8,192.96740766610202,579.7819201280502,113.4,156.2,1.106319862507987,3B,200
"""
PROFILES = """job_id,gpu,t_roll_s,t_train_s
j0,H200,,156.31186536973274
j1,H200,,424.8626561725995
"""


@pytest.fixture()
def case(tmp_path):
    """The two jobs, their measured H200 training times and the three-type fleet, as files
    (``fleet plan`` reads them) and as objects."""
    paths = {name: tmp_path / name for name in ("jobs.csv", "profiles.csv", "fleet.yaml")}
    paths["jobs.csv"].write_text(TRACE)
    paths["profiles.csv"].write_text(PROFILES)
    paths["fleet.yaml"].write_text(yaml.safe_dump(FLEET))
    profiles = Profiles({("j0", "H200"): (None, 156.31186536973274), ("j1", "H200"): (None, 424.8626561725995)})
    return paths, fleet_from_dict(FLEET), profiles, read_trace(paths["jobs.csv"])


def test_a_lone_group_moves_to_the_fleet_optimum(case):
    _, fleet, profiles, jobs = case
    state, _ = plan_jobs(FleetPlanner(fleet, profiles, space=FULL_SPACE), jobs)
    groups = [(name, [m.job.job_id for m in g.members]) for name, (_, sub) in state.views.items()
              for g in sub.groups.values()]
    assert groups == [("H20/H200", ["j0", "j1"])] and state.effective_cost_per_hour() == pytest.approx(94.57, abs=5e-3)
    result = improve_fleet(state, space=FULL_SPACE)
    optimum = solve_fleet(fleet, jobs, profiles, FULL_SPACE).objective
    assert optimum == pytest.approx(76.78, abs=5e-3)
    assert result.moves and result.cost_after == pytest.approx(optimum)
    assert state.effective_cost_per_hour() == pytest.approx(optimum)
    placed = sorted((name, g.colocated, [m.job.job_id for m in g.members]) for name, (_, sub) in state.views.items()
                    for g in sub.groups.values())
    assert placed == [("H200/H200", True, ["j0"]), ("H200/H200", True, ["j1"])]


def test_fleet_plan_prints_the_improvement_and_no_saving_left_to_the_best_fixed_plan(case):
    paths, *_ = case
    result = CliRunner().invoke(app, ["fleet", "plan", "--jobs", str(paths["jobs.csv"]), "--cluster",
                                      str(paths["fleet.yaml"]), "--profiles", str(paths["profiles.csv"]),
                                      "--space", "full", "--optimal"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "improvement: $94.57/h -> $76.78/h (1 regroupings" in said
    assert "(rollmux on H200/H200) $76.78/h: 0.0% less" in said


def test_on_one_view_a_lone_group_is_left_as_rollmux_improve_leaves_it(case):
    """A two-pool fleet has nowhere else to move a group: sets of two groups or more, as
    ``rollmux.improve`` tries them (no solve for a plan of one group)."""
    _, _, _, jobs = case
    state, _ = plan_jobs(FleetPlanner(fleet_of(Cluster())), jobs[:1])
    assert len(state.groups) == 1
    before = state.effective_cost_per_hour()
    result = improve_fleet(state)
    assert (result.solves, result.moves, state.effective_cost_per_hour()) == (0, (), before)
