"""The rollmux command: simulate, plan and trace, including their errors."""
import json

from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.traces.format import write_trace
from rollmux.traces.generate import generate

runner = CliRunner()


def small_trace(tmp_path, n=12):
    path = tmp_path / "jobs.csv"
    write_trace(generate(n, seed=2), path)
    return path


def test_simulate_writes_json_and_plots(tmp_path):
    trace = small_trace(tmp_path)
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--policies", "rollmux,solo-d,optimal",
                                 "--out", str(out), "--json", str(out / "r.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "r.json").read_text())
    assert set(data["policies"]) == {"rollmux", "solo-d", "optimal"}
    roll, solo = data["policies"]["rollmux"], data["policies"]["solo-d"]
    assert roll["slo_attainment"] == 1.0 and len(roll["jobs"]) == 12
    assert roll["total_cost"] <= solo["total_cost"]
    for name in ("cost_over_time.png", "gpus_in_use.png", "gantt.png"):
        assert (out / name).stat().st_size > 1000


def test_simulate_rejects_unknown_policy_and_bad_trace(tmp_path):
    r = runner.invoke(app, ["simulate", "--policies", "rollmux,fastest"])
    assert r.exit_code == 2 and "fastest" in r.output
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,"
                   "mem_train_gb,slo,model\nj1,0,100,8,8,-5,10,1,1,1.5,7B\n")
    r = runner.invoke(app, ["simulate", "--trace", str(bad)])
    assert r.exit_code == 2 and "line 2" in r.output and "t_roll_s" in r.output


def test_plan_prints_explanations_and_writes_plan_json(tmp_path):
    trace = small_trace(tmp_path, 6)
    out = tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", "--jobs", str(trace), "--json", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    placed = [j["job_id"] for g in plan["groups"] for j in g["jobs"]]
    assert len(placed) == 6 and len(plan["decisions"]) == 6
    assert all(j["slowdown"] <= j["slo"] + 1e-9 for g in plan["groups"] for j in g["jobs"])
    assert abs(plan["cost_per_hour"] - sum(g["cost_per_hour"] for g in plan["groups"])) < 1e-6
    assert "chosen" in r.output
    imp = plan["improvement"]
    assert imp["cost_after"] == plan["cost_per_hour"] <= imp["cost_before"] and "improvement: $" in r.output
    r = runner.invoke(app, ["plan", "--jobs", str(trace), "--no-improve", "--json", str(out)])
    assert r.exit_code == 0 and json.loads(out.read_text())["improvement"] is None
    assert json.loads(out.read_text())["cost_per_hour"] == imp["cost_before"]


def test_plan_optimal_is_no_dearer_than_the_planner(tmp_path):
    trace = small_trace(tmp_path, 5)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert runner.invoke(app, ["plan", "--jobs", str(trace), "--json", str(a)]).exit_code == 0
    assert runner.invoke(app, ["plan", "--jobs", str(trace), "--optimal", "--json", str(b)]).exit_code == 0
    assert json.loads(b.read_text())["cost_per_hour"] <= json.loads(a.read_text())["cost_per_hour"] + 1e-9


def test_trace_generate_and_from_philly(tmp_path):
    out = tmp_path / "g.csv"
    assert runner.invoke(app, ["trace", "generate", "--out", str(out), "--count", "7"]).exit_code == 0
    assert len(out.read_text().strip().splitlines()) == 8
    philly = tmp_path / "p.csv"
    philly.write_text("#job id,arrival time (sec),topology,shape,size,duration (sec)\n"
                      "1,0.0,CLOS,8+8,16,7200.0\n2,10.0,CLOS,1,1,0.0\n3,oops\n")
    conv = tmp_path / "c.csv"
    r = runner.invoke(app, ["trace", "from-philly", str(philly), "--out", str(conv)])
    assert r.exit_code == 0, r.output
    assert len(conv.read_text().strip().splitlines()) == 2
