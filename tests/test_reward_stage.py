"""Reward as a billed stage in the simulator (issue 15, RollArt; docs/rollart.md).

A job with ``reward_s`` > 0 scores on a shared, elastic reward pool: each completed
iteration bills ``reward_s`` / 3600 x ``reward_price_per_hour`` on a separate "reward"
line, included in every policy's cost, and the job's reward model leaves its rollout
nodes (``Job.mem(ROLLOUT)`` = ``mem_roll_gb`` - ``reward_mem_gb``).
"""
import csv
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from rollmux.cli import app
from rollmux.errors import SpecError, TraceFormatError
from rollmux.exact import solve
from rollmux.model import REWARD_PRICE_PER_HOUR, ROLLOUT, TRAIN, Cluster, Job, PoolSpec
from rollmux.plan_state import PlanState
from rollmux.planner import Planner
from rollmux.policies import make_policy
from rollmux.report.html import write_html_report
from rollmux.report.jobs_csv import job_rows
from rollmux.report.tables import simulate_table
from rollmux.runtime.api_models import JobSpec
from rollmux.sim.engine import simulate
from rollmux.sim.optimal_curve import optimal_curve
from rollmux.traces.builtin import load_trace
from rollmux.traces.format import read_trace, write_trace
from rollmux.traces.generate import generate
from rollmux.traces.philly import TABLE2_MEM_GB

runner = CliRunner()
POLICIES = ("rollmux", "solo-d", "colocated")


def _two_jobs(reward: bool = True) -> list[Job]:
    """a: 10 iterations x 360 s at $2/h = $2.00; b: 5 x 720 s at the default $1.85/h = $1.85."""
    a = Job("a", 100.0, 120.0, mem_roll_gb=200, mem_train_gb=100, slo=1.5, model="7B", iterations=10,
            reward_s=360.0 if reward else 0.0, reward_price_per_hour=2.0)
    b = Job("b", 150.0, 80.0, mem_roll_gb=200, mem_train_gb=100, slo=1.5, model="7B", iterations=5,
            arrival_s=50.0, reward_s=720.0 if reward else 0.0)
    return [a, b]


# --- billing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", POLICIES)
def test_the_reward_bill_of_a_two_job_trace_by_hand(name):
    plain = simulate(_two_jobs(False), Cluster(), make_policy(name))
    billed = simulate(_two_jobs(True), Cluster(), make_policy(name))
    assert billed.reward_cost == pytest.approx(3.85, abs=1e-12)  # 2.00 + 1.85
    assert {j.job_id: j.reward_cost for j in billed.jobs} == pytest.approx({"a": 2.0, "b": 1.85}, abs=1e-12)
    # the stage changes no schedule (scoring streams inside the rollout), only the bill
    assert [(j.job_id, j.placed_s, j.end_s) for j in billed.jobs] == [(j.job_id, j.placed_s, j.end_s)
                                                                      for j in plain.jobs]
    assert billed.total_cost == pytest.approx(plain.total_cost + 3.85, abs=1e-9)
    assert billed.used_cost == pytest.approx(plain.used_cost + 3.85, abs=1e-9)
    assert billed.reward_cost_per_hour == pytest.approx(3.85 / (billed.reference_span_s / 3600), rel=1e-12)
    assert billed.cost_per_hour == pytest.approx(plain.cost_per_hour + billed.reward_cost_per_hour, rel=1e-12)
    assert plain.reward_cost == 0.0
    summary = json.loads(json.dumps(billed.summary()))
    assert summary["reward_cost"] == pytest.approx(3.85) and summary["total_cost"] == billed.total_cost
    assert [j["reward_cost"] for j in summary["jobs"]] == pytest.approx([2.0, 1.85])


def test_owned_nodes_still_pay_the_reward_pool_per_use():
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                      pricing="owned")
    plain = simulate(_two_jobs(False), cluster, make_policy("rollmux"))
    billed = simulate(_two_jobs(True), cluster, make_policy("rollmux"))
    assert billed.pricing == "owned"
    assert billed.total_cost == pytest.approx(plain.total_cost + 3.85, abs=1e-9)


def test_fixed_departures_bill_only_the_iterations_completed():
    from rollmux.accounting import ACCOUNTINGS
    acct = ACCOUNTINGS["paper"]
    jobs = [replace(j, iterations=None, duration_s=1000.0) for j in _two_jobs(True)]
    r = simulate(jobs, Cluster(), make_policy("rollmux", accounting=acct), accounting=acct)
    by_id = {j.job_id: j for j in jobs}
    assert r.reward_cost == pytest.approx(sum(by_id[o.job_id].reward_s * by_id[o.job_id].reward_price_per_hour
                                              * o.iterations / 3600 for o in r.jobs), abs=1e-12)
    assert 0 < r.reward_cost < 3.85  # fewer iterations than the 10 + 5 of the full run fit in 1,000 s


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(30, 300), st.floats(30, 300), st.integers(1, 12),
                          st.sampled_from([0.0, 5.0, 90.0, 400.0]), st.floats(0.0, 10.0), st.floats(0, 5000)),
                min_size=1, max_size=6))
def test_the_reward_cost_is_the_sum_of_iterations_times_seconds_times_price_for_every_policy(specs):
    jobs = [Job(f"j{i}", tr, tt, iterations=n, reward_s=rs, reward_price_per_hour=price, arrival_s=arr,
                mem_roll_gb=300, mem_train_gb=300, reward_mem_gb=100, slo=1.6, model="7B")
            for i, (tr, tt, n, rs, price, arr) in enumerate(specs)]
    expected = sum(j.iterations * j.reward_s * j.reward_price_per_hour / 3600 for j in jobs)
    for name in (*POLICIES, "most-idle", "gavel"):
        r = simulate(jobs, Cluster(), make_policy(name))
        assert sorted(o.iterations for o in r.jobs) == sorted(j.iterations for j in jobs)
        assert r.reward_cost == pytest.approx(expected, rel=1e-12, abs=1e-12), name
    bound = optimal_curve(jobs, Cluster())
    if not bound.note.startswith("skipped"):
        assert bound.reward_cost == pytest.approx(expected, rel=1e-12, abs=1e-12)


# --- defaults change nothing --------------------------------------------------------------------

#: The production trace's figures before the reward stage existed (commit 332ad03; rollmux's
#: re-taken when the analysis split disconnected groups into their parts, and when the
#: execution rule started reserving a waiting phase's nodes).
BEFORE = {
    "rollmux": (245157.01020891202, 662.2650768617809, 1.0, {"new-group": 54, "scaled": 42, "packed": 104},
                1336587.0000000526, 5721, 0.2962133529493446, 0.325493388243036, 111920148.10000329),
    "solo-d": (354148.0633422488, 956.6925872931012, 1.0, {"new-group": 200}, 1332646.5000000242, 1398,
               0.44372551826452256, 0.5562744817355569, 109577355.40000169),
    "colocated": (259407.09343999115, 700.7601313506382, 0.98, {"new-group": 200}, 1350241.500000024, 1006,
                  None, 0.015520115917430966, 109263871.69999921),
}


@pytest.mark.parametrize("name", POLICIES)
def test_a_trace_without_reward_columns_gives_the_results_it_gave_before(name):
    jobs = load_trace("production", Cluster())[0]
    assert all(j.reward_s == 0 and j.reward_mem_gb == 0 for j in jobs)
    r = simulate(jobs, Cluster(), make_policy(name))
    cost, per_hour, slo, outcomes, span, events, rb, tb, ends = BEFORE[name]
    assert r.total_cost == pytest.approx(cost, rel=1e-12) and r.used_cost == r.total_cost
    assert r.cost_per_hour == pytest.approx(per_hour, rel=1e-12)
    assert (r.slo_attainment, dict(r.outcomes), r.events) == (slo, outcomes, events)
    assert r.span_s == pytest.approx(span, rel=1e-12)
    assert sum(j.end_s for j in r.jobs) == pytest.approx(ends, rel=1e-12)
    assert r.bubble(ROLLOUT) == (None if rb is None else pytest.approx(rb, rel=1e-12))
    assert r.bubble(TRAIN) == pytest.approx(tb, rel=1e-12)
    assert r.reward_cost == 0.0 and all(j.reward_cost == 0.0 for j in r.jobs)
    assert "reward" not in str(simulate_table([r], name).caption or "")


def test_a_trace_without_reward_writes_no_reward_column(tmp_path):
    jobs = generate(12, seed=2)
    write_trace(jobs, tmp_path / "t.csv")
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert "reward" not in header
    assert all(j.mem(ROLLOUT) == j.mem_roll_gb for j in jobs)


# --- memory credit ------------------------------------------------------------------------------

def _mem_pair(reward_s: float) -> tuple[Cluster, Job, Job]:
    """Rollout nodes of 600 GB; a holds 400 GB; b 400 GB of which 250 GB are its reward model."""
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, host_mem_gb=600.0))
    a = Job("a", 100, 100, mem_roll_gb=400, mem_train_gb=100, slo=2.0, iterations=10)
    b = Job("b", 100, 100, mem_roll_gb=400, mem_train_gb=100, slo=2.0, iterations=10, arrival_s=10,
            reward_s=reward_s, reward_mem_gb=250)
    return cluster, a, b


def test_mem_credits_the_reward_model_only_on_the_shared_service():
    _, _, own = _mem_pair(0.0)
    _, _, shared = _mem_pair(30.0)
    assert own.mem(ROLLOUT) == 400 and shared.mem(ROLLOUT) == 150
    assert own.mem(TRAIN) == shared.mem(TRAIN) == 100


def test_a_job_that_did_not_fit_a_groups_rollout_node_packs_there_on_the_shared_service():
    for reward_s, outcome, rollout_nodes in ((0.0, "scaled", ("R1",)), (30.0, "packed", ("R0",))):
        cluster, a, b = _mem_pair(reward_s)
        state = PlanState(cluster)
        planner = Planner()
        state.apply(a, planner.decide(state, a).placement)
        d = planner.decide(state, b, explain=True)
        assert (d.outcome, d.placement.rollout_nodes) == (outcome, rollout_nodes), reward_s
        state.apply(b, d.placement)
        g = state.groups[state.job_group["b"]]
        assert all(g.mem_used(n, ROLLOUT) <= 600 for n in g.rollout_nodes)
    # the exact solver and a baseline that reads Job.mem follow too
    costs = [solve(*_mem_pair(rs)[:1], _mem_pair(rs)[1:]).cost_per_hour for rs in (0.0, 30.0)]
    assert costs[1] == pytest.approx(costs[0] - Cluster().node_price(ROLLOUT))
    for reward_s, packed in ((0.0, 0), (30.0, 1)):
        cluster, a, b = _mem_pair(reward_s)
        r = simulate([a, b], cluster, make_policy("most-idle"))
        assert r.outcomes.get("packed", 0) == packed and r.peak_gpus[ROLLOUT] == 16 - 8 * packed


def test_the_planners_default_path_packs_it_too():
    for reward_s, packed in ((0.0, 0), (30.0, 1)):
        cluster, a, b = _mem_pair(reward_s)
        r = simulate([a, b], cluster, make_policy("rollmux"))
        assert r.outcomes.get("packed", 0) == packed


# --- trace format, validation, API ------------------------------------------------------------------

def test_reward_columns_round_trip(tmp_path):
    jobs = _two_jobs(True)
    jobs[0].reward_mem_gb = 75.5
    write_trace(jobs, tmp_path / "t.csv")
    header = (tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    assert header[-3:] == ["reward_s", "reward_price_per_hour", "reward_mem_gb"]
    assert read_trace(tmp_path / "t.csv") == jobs
    # empty optional values take the defaults
    text = ("job_id,arrival_s,iterations,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,mem_train_gb,slo,"
            "model,reward_s,reward_price_per_hour,reward_mem_gb\nx,0,3,8,8,10,10,100,100,1.5,7B,,,\n")
    (tmp_path / "e.csv").write_text(text)
    (x,) = read_trace(tmp_path / "e.csv")
    assert (x.reward_s, x.reward_price_per_hour, x.reward_mem_gb) == (0.0, REWARD_PRICE_PER_HOUR, 0.0)


@pytest.mark.parametrize("column, value, said", [
    ("reward_s", "-1", "reward_s=-1.0: expected seconds from 0 to 1e+06"),
    ("reward_s", "nan", "reward_s=nan"),
    ("reward_price_per_hour", "-0.5", "reward_price_per_hour=-0.5: expected a price from 0 to 1e+06"),
    ("reward_price_per_hour", "cheap", "'cheap' is not a number"),
    ("reward_mem_gb", "150", "reward_mem_gb=150.0: expected at most mem_roll_gb (100.0 GB)"),
    ("reward_mem_gb", "inf", "reward_mem_gb=inf"),
])
def test_bad_reward_values_are_rejected_naming_the_field_and_line(tmp_path, column, value, said):
    cols = ["reward_s", "reward_price_per_hour", "reward_mem_gb"]
    row = {"reward_s": "10", "reward_price_per_hour": "2", "reward_mem_gb": "50", column: value}
    text = ("# a comment\njob_id,arrival_s,iterations,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,"
            "mem_train_gb,slo,model," + ",".join(cols) + "\n"
            "ok,0,3,8,8,10,10,100,100,1.5,7B,0,1,0\n"
            "bad,5,3,8,8,10,10,100,100,1.5,7B," + ",".join(row[c] for c in cols) + "\n")
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert (info.value.line, info.value.column) == (4, column)
    assert said in str(info.value) and str(path) in str(info.value)


def test_job_validate_names_the_reward_field():
    for kwargs, name in (({"reward_s": True}, "reward_s"), ({"reward_price_per_hour": float("inf")},
                                                          "reward_price_per_hour"),
                         ({"reward_mem_gb": -1.0}, "reward_mem_gb"), ({"reward_mem_gb": 10.0}, "reward_mem_gb")):
        with pytest.raises(SpecError) as info:
            Job("j", 10, 10, **kwargs).validate()
        assert info.value.field == name
    # the credited memory is what must fit a node
    Job("j", 10, 10, mem_roll_gb=700, reward_mem_gb=200, reward_s=1).validate(
        Cluster(rollout=PoolSpec("H20", 1.85, host_mem_gb=600.0)))
    with pytest.raises(SpecError, match="mem_roll_gb"):
        Job("j", 10, 10, mem_roll_gb=700, reward_mem_gb=200).validate(
            Cluster(rollout=PoolSpec("H20", 1.85, host_mem_gb=600.0)))


def test_the_api_jobspec_takes_the_reward_fields():
    spec = JobSpec(job_id="r1", t_roll_s=100, t_train_s=50, mem_roll_gb=300, reward_s=45.0,
                   reward_price_per_hour=3.0, reward_mem_gb=120)
    job = spec.to_job()
    assert (job.reward_s, job.reward_price_per_hour, job.reward_mem_gb) == (45.0, 3.0, 120)
    assert job.mem(ROLLOUT) == 180
    plain = JobSpec(job_id="r2", t_roll_s=100, t_train_s=50).to_job()
    assert (plain.reward_s, plain.reward_price_per_hour, plain.reward_mem_gb) == (0.0, REWARD_PRICE_PER_HOUR, 0.0)
    for bad, field in (({"reward_s": -1}, "reward_s"), ({"reward_price_per_hour": True}, "reward_price_per_hour"),
                       ({"reward_mem_gb": 400, "mem_roll_gb": 300}, "reward_mem_gb")):
        with pytest.raises(ValidationError) as info:
            JobSpec(job_id="r3", t_roll_s=100, t_train_s=50, **bad)
        assert info.value.errors()[0]["loc"] == (field,)


# --- generator, CLI, reports ----------------------------------------------------------------------

def test_generate_gives_a_share_of_jobs_a_reward_model_and_changes_nothing_else():
    base = generate(40, seed=7)
    shared = generate(40, seed=7, reward_share=0.25, reward_s=90.0)
    inhouse = generate(40, seed=7, reward_share=0.25, reward_s=0.0)
    marked = [i for i, j in enumerate(shared) if j.reward_mem_gb]
    assert len(marked) == 10 and marked == [i for i, j in enumerate(inhouse) if j.reward_mem_gb]
    for i, (b, s, h) in enumerate(zip(base, shared, inhouse)):
        if i not in marked:
            assert b == s == h
            continue
        rm = TABLE2_MEM_GB[int(b.model.rstrip("B"))][0]
        assert s.reward_mem_gb == h.reward_mem_gb == rm
        assert s.mem_roll_gb == h.mem_roll_gb == pytest.approx(b.mem_roll_gb + rm)
        assert (s.reward_s, h.reward_s, s.reward_price_per_hour) == (90.0, 0.0, REWARD_PRICE_PER_HOUR)
        assert s.mem(ROLLOUT) == pytest.approx(b.mem_roll_gb) and h.mem(ROLLOUT) == pytest.approx(2 * rm)
        assert replace(s, reward_s=0.0, reward_mem_gb=0.0, mem_roll_gb=b.mem_roll_gb) == b
    for kwargs in ({"reward_share": 1.5}, {"reward_s": -1.0}, {"reward_price_per_hour": float("nan")}):
        with pytest.raises(SpecError):
            generate(4, seed=1, **kwargs)


def test_cli_generate_and_simulate_report_the_reward_stage(tmp_path):
    trace, js, jobs_csv, html = tmp_path / "t.csv", tmp_path / "r.json", tmp_path / "j.csv", tmp_path / "r.html"
    r = runner.invoke(app, ["trace", "generate", "--out", str(trace), "--count", "12", "--seed", "4",
                            "--reward-share", "0.5", "--reward-s", "120", "--reward-price", "2.5"])
    assert r.exit_code == 0, r.output
    jobs = read_trace(trace)
    users = [j for j in jobs if j.reward_s]
    assert len(users) == 6 and {(j.reward_s, j.reward_price_per_hour) for j in users} == {(120.0, 2.5)}
    r = runner.invoke(app, ["simulate", "--trace", str(trace), "--policies", "rollmux,solo-d", "--json", str(js),
                            "--jobs-csv", str(jobs_csv), "--html", str(html)])
    assert r.exit_code == 0, r.output
    expected = sum(j.reward_cost(j.solo_iterations()) for j in jobs)
    assert expected > 0
    data = json.loads(js.read_text())
    for name in ("rollmux", "solo-d"):
        assert data["policies"][name]["reward_cost"] == pytest.approx(expected, rel=1e-12)
    assert "reward (shared pool, billed per use" in " ".join(r.output.split())
    with jobs_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert sum(float(row["reward_usd"]) for row in rows) == pytest.approx(2 * expected, abs=1e-4)
    page = html.read_text()
    assert "<th>reward $</th>" in page and f"{expected:,.0f}" in page
    r = runner.invoke(app, ["trace", "generate", "--out", str(trace), "--reward-share", "1.5"])
    assert r.exit_code != 0 and "--reward-share" in r.output


def test_job_rows_and_html_carry_the_per_job_reward(tmp_path):
    res = simulate(_two_jobs(True), Cluster(), make_policy("rollmux"))
    rows = job_rows([res])
    assert {row["job_id"]: row["reward_usd"] for row in rows} == {"a": 2.0, "b": 1.85}
    path = write_html_report([res], Cluster(), tmp_path / "r.html", title="t", trace_info={}, accounting="ours")
    assert "<td>1.85</td>" in path.read_text()


def test_the_sdk_submits_the_reward_columns_of_a_job():
    from rollmux.runtime.sdk import _spec_dict

    job = Job("r", 10.0, 20.0, mem_roll_gb=300.0, reward_s=12.0, reward_price_per_hour=2.5, reward_mem_gb=100.0)
    spec = _spec_dict(job)
    assert (spec["reward_s"], spec["reward_price_per_hour"], spec["reward_mem_gb"]) == (12.0, 2.5, 100.0)
