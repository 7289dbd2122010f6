"""``--accounting paper``: each of the authors' modelling choices changes exactly what it says;
the default accounting (ours) leaves every result as it was."""
import json

import pytest
from typer.testing import CliRunner

from rollmux.accounting import ACCOUNTINGS, OURS, PAPER, departure_span_s
from rollmux.cli import app
from rollmux.errors import RollMuxError
from rollmux.model import POOLS, ROLLOUT, TRAIN, Cluster, Job
from rollmux.plan_state import PlanState
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace


def _job(job_id, arrival, duration=20_000.0, slo=2.0, mem=100.0, gpus=8, t_roll=100.0, t_train=100.0):
    return Job(job_id, t_roll, t_train, gpus, gpus, mem, mem, slo, "7B", arrival, duration)


def _run(jobs, accounting, policy="rollmux", cluster=None, **kw):
    return simulate(jobs, cluster or Cluster(), make_policy(policy, 0, accounting), accounting=accounting, **kw)


def test_accountings_are_named_and_ours_is_every_default():
    assert set(ACCOUNTINGS) == {"ours", "paper", "paper-widths"}
    widths = ACCOUNTINGS["paper-widths"]
    assert not widths.one_node_per_pool and widths.fixed_departures and not widths.saturation_gate
    assert OURS.fixed_departures is False and OURS.switch_cost and OURS.host_memory_limit
    assert OURS.saturation_gate and OURS.whole_run_slo_checks and not OURS.one_node_per_pool
    assert OURS.rollout_price_ratio is None and OURS.apply_cluster(Cluster()) == Cluster()


def test_fixed_departure_is_arrival_plus_duration_whatever_the_slowdown():
    jobs = [_job("a", 0.0, t_roll=150.0), _job("b", 50.0, duration=30_000.0, t_roll=150.0)]
    paper = _run(jobs, PAPER)
    assert paper.outcomes["packed"] == 1  # sharing one group: both slowed down
    for o in paper.jobs:
        job = next(j for j in jobs if j.job_id == o.job_id)
        assert o.end_s == job.arrival_s + job.duration_s
        assert o.slowdown > 1.05
        assert o.iterations < job.solo_iterations()  # slowed, so less work in the same time
    ours = _run(jobs, OURS)
    assert any(o.end_s > next(j for j in jobs if j.job_id == o.job_id).arrival_s + 20_000.0 + 1 for o in ours.jobs)
    assert paper.reference_span_s == departure_span_s(jobs) == 30_050.0


def test_a_job_that_leaves_mid_phase_stops_counting_busy_time():
    jobs = [_job("a", 0.0, duration=250.0)]  # leaves 50 s into its second rollout
    r = _run(jobs, PAPER)
    assert r.jobs[0].iterations == 1 and r.jobs[0].end_s == 250.0
    # busy: 100 s rollout + 100 s train + 50 s of the cut rollout, 8 GPUs each
    assert r.utilization[ROLLOUT] * r.gpu_seconds[ROLLOUT] == pytest.approx(150.0 * 8)
    assert r.utilization[TRAIN] * r.gpu_seconds[TRAIN] == pytest.approx(100.0 * 8)


def test_a_job_that_leaves_before_one_iteration_misses_its_slo():
    r = _run([_job("a", 0.0, duration=150.0)], PAPER)
    assert r.jobs[0].iterations == 0 and not r.jobs[0].slo_met


def test_no_switch_cost():
    cl = PAPER.apply_cluster(Cluster())
    assert all(cl.switch_cost.seconds(m, p) == 0 for m in ("3B", "7B", "14B", "32B") for p in POOLS)
    jobs = [_job("a", 0.0), _job("b", 50.0)]
    for acct, switched in ((PAPER, False), (OURS, True)):
        spans = _run(jobs, acct, record_spans=True).spans
        assert any(s[5] > s[4] for s in spans) is switched  # (.., now, body start, end)


def test_a_job_too_large_for_host_memory_is_placed():
    big = [_job("big", 0.0, mem=5_000.0)]
    with pytest.raises(RollMuxError):
        _run(big, OURS)
    assert len(_run(big, PAPER).jobs) == 1
    # two jobs whose states do not fit one node together share it under the paper's accounting
    pair = [_job("a", 0.0, mem=1_500.0), _job("b", 50.0, mem=1_500.0)]
    assert _run(pair, OURS).outcomes["packed"] == 0
    assert _run(pair, PAPER).outcomes["packed"] == 1


def test_unit_conversion_rollout_node_at_a_third_of_a_training_node():
    duration = 36_000.0
    r = _run([_job("a", 0.0, duration=duration)], PAPER)
    cl = PAPER.apply_cluster(Cluster())
    assert cl.node_price(TRAIN) == pytest.approx(42.24) and cl.node_price(ROLLOUT) == pytest.approx(42.24 / 3)
    units = PAPER.units(r.total_cost, cl)  # H800-node-seconds, a rollout node counting 1/3
    assert units == pytest.approx(duration * (1 + 1 / 3))
    assert r.total_cost == pytest.approx(units * 42.24 / 3600)
    assert r.cost_per_hour == pytest.approx(r.total_cost / (duration / 3600))


def test_one_node_per_pool_for_rollmux_only():
    wide = _job("wide", 0.0, gpus=16)
    cl = PAPER.apply_cluster(Cluster())
    d = make_policy("rollmux", 0, PAPER).place(PlanState(cl), wide)
    assert len(d.placement.rollout_nodes) == len(d.placement.train_nodes) == 1
    d = make_policy("rollmux", 0, OURS).place(PlanState(cl), wide)
    assert len(d.placement.rollout_nodes) == len(d.placement.train_nodes) == 2
    assert _run([wide], PAPER, "solo-d").peak_gpus == {ROLLOUT: 16, TRAIN: 16}


def test_no_saturation_gate():
    # two jobs whose training phases fill the cycle saturate their group
    jobs = [_job("a", 0.0, t_roll=100.0, t_train=100.0, slo=2.0),
            _job("b", 10.0, t_roll=100.0, t_train=100.0, slo=2.0),
            _job("c", 20.0, t_roll=100.0, t_train=10.0, slo=2.0)]
    ours, paper = make_policy("rollmux", 0, OURS), make_policy("rollmux", 0, PAPER)
    cl = PAPER.apply_cluster(Cluster())
    for policy, gated in ((ours, True), (paper, False)):
        state = PlanState(cl)
        for j in jobs[:2]:
            state.apply(j, policy.place(state, j).placement)
        assert state.analysis("g0").saturated
        d = policy.planner.decide(state, jobs[2], explain=True)
        assert any("saturated" in c.reason for c in d.candidates) is gated


def test_default_accounting_leaves_results_unchanged():
    jobs = load_trace("production", Cluster())[0]
    default = simulate(jobs, Cluster(), make_policy("rollmux"))
    ours = _run(jobs, OURS)
    assert default.total_cost == ours.total_cost and round(default.cost_per_hour, 1) == 662.3
    assert [o.to_dict() for o in default.jobs] == [o.to_dict() for o in ours.jobs]
    assert default.accounting == "ours"


def test_cli_accounting_option(tmp_path):
    runner = CliRunner()
    out = {}
    for name in ("default", "ours", "paper"):
        args = ["simulate", "--policies", "solo-d,colocated", "--json", str(tmp_path / f"{name}.json")]
        if name != "default":
            args += ["--accounting", name]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert f"{'ours' if name == 'default' else name} accounting" in r.output
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())
    cost = {k: {p: v["policies"][p]["cost_per_hour"] for p in ("solo-d", "colocated")} for k, v in out.items()}
    assert cost["default"] == cost["ours"]
    assert round(cost["ours"]["solo-d"], 1) == 956.7
    assert round(cost["paper"]["solo-d"], 1) == 945.0 and round(cost["paper"]["colocated"], 1) == 708.7
    assert out["paper"]["accounting"]["name"] == "paper" and out["paper"]["accounting"]["fixed_departures"]
    assert runner.invoke(app, ["simulate", "--accounting", "theirs"]).exit_code == 2


def test_regrouping_under_fixed_departures_lets_every_job_leave_on_time():
    """A job whose recorded departure falls while it moves between groups leaves once it is
    admitted (it used to look never placed and ran for ever); regrouped jobs stay on one
    node per pool, as the planner placed them."""
    cluster = PAPER.apply_cluster(Cluster())
    jobs, _ = load_trace("production", cluster, 0)
    r = simulate(jobs, cluster, make_policy("rollmux-regroup", 0, PAPER), "worst", 0, accounting=PAPER)
    assert r.outcomes["regrouped"] > 0 and not r.rejected and len(r.jobs) == len(jobs)
    due = {j.job_id: j.arrival_s + j.duration_s for j in jobs}
    # due while moving: its own iteration, then its new group's last member's, then the migration
    slack = 2 * max(j.slo for j in jobs) * max(j.t_solo for j in jobs) + 300.0
    assert all(o.end_s <= due[o.job_id] + slack for o in r.jobs)
    assert sum(o.end_s > due[o.job_id] + 1e-6 for o in r.jobs) <= r.outcomes["regrouped"]
    assert r.peak_gpus[TRAIN] <= 8 * len(jobs)


def test_the_papers_rollmux_at_equal_widths_is_within_3_percent_of_their_weave():
    """Their Weave at equal widths: $572.0/h on production (docs/reproduce.md)."""
    acct = ACCOUNTINGS["paper-widths"]
    cluster = acct.apply_cluster(Cluster())
    jobs, _ = load_trace("production", cluster, 0)
    r = simulate(jobs, cluster, make_policy("rollmux", 0, acct), "worst", 0, accounting=acct)
    assert abs(r.cost_per_hour - 572.0) <= 0.03 * 572.0 and r.slo_attainment == 1.0


def test_paper_json_is_standard_json_with_null_for_what_is_infinite(tmp_path):
    """The paper's accounting has no host-memory limit (infinite GB) and a job cut off before
    one iteration has an infinite slowdown: --json wrote ``Infinity``, which JSON parsers
    refuse. They are null now."""
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,arrival_s,duration_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,"
                     "mem_train_gb,slo,model\na,0,10000,8,8,200,200,10,10,1.5,7B\nb,10,100,8,8,200,200,10,10,1.5,7B\n")
    path = tmp_path / "m.json"
    r = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--accounting", "paper", "--policies", "rollmux",
                                 "--json", str(path)])
    assert r.exit_code == 0, r.output

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    data = json.loads(path.read_text(), parse_constant=refuse)
    assert data["cluster"]["rollout"]["host_mem_gb"] is None and data["cluster"]["train"]["host_mem_gb"] is None
    policy = data["policies"]["rollmux"]
    b = next(j for j in policy["jobs"] if j["job_id"] == "b")
    assert b["iterations"] == 0 and b["slowdown"] is None and b["e2e_slowdown"] is None
    assert policy["per_kind"]["sync"]["mean_slowdown"] is None
    assert next(j for j in policy["jobs"] if j["job_id"] == "a")["slowdown"] > 0  # finite figures stay numbers


def test_a_phase_cut_by_a_fixed_departure_is_recorded_to_the_departure():
    """A job leaving mid-phase at its fixed departure had that phase recorded (and drawn in
    the Gantt) to its scheduled end: past the job's end, and over the phase that took its
    node then. Here a leaves 200 s into a 300 s training, b (its rollout done) trains from
    that instant on the same node, and b leaves 60 s into its last training."""
    jobs = [_job("a", 0.0, duration=700.0, t_train=300.0, slo=3.0), _job("b", 10.0, duration=1_150.0, slo=3.0)]
    r = _run(jobs, PAPER, record_spans=True)
    end = {o.job_id: o.end_s for o in r.jobs}
    assert end == {"a": 700.0, "b": 1_160.0} and r.outcomes["packed"] == 1
    assert ("g0", "a", TRAIN, ("T0",), 500.0, 500.0, 700.0) in r.spans
    assert ("g0", "b", TRAIN, ("T0",), 700.0, 700.0, 800.0) in r.spans
    assert r.spans[-1] == ("g0", "b", TRAIN, ("T0",), 1_100.0, 1_100.0, 1_160.0)
    assert all(s[4] <= s[5] <= s[6] <= end[s[1]] for s in r.spans)
    lanes: dict[tuple[str, str], list] = {}
    for gid, _, _, nodes, start, _, stop in r.spans:
        for node in nodes:
            lanes.setdefault((gid, node), []).append((start, stop))
    for phases in lanes.values():
        phases.sort()
        assert all(nxt[0] >= prev[1] for prev, nxt in zip(phases, phases[1:]))
