"""``staleness`` at the edges: the job contract, the trace column, the generator, the
live API (which refuses asynchronous jobs) and the simulate table's per-kind lines."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rollmux.errors import SpecError, TraceFormatError
from rollmux.model import Cluster, Job, PoolSpec, SwitchCost
from rollmux.policies import make_policy
from rollmux.report.tables import kind_lines
from rollmux.runtime.service import Service, ServiceConfig, create_app
from rollmux.sim.engine import simulate
from rollmux.traces.format import read_trace, write_trace
from rollmux.traces.generate import generate

HEADER = "job_id,arrival_s,rollout_gpus,train_gpus,t_roll_s,t_train_s,mem_roll_gb,mem_train_gb,slo,model,iterations"


@pytest.mark.parametrize("value", [-1, 1.5, True, "1"])
def test_job_staleness_must_be_an_integer_at_least_zero(value):
    with pytest.raises(SpecError, match="staleness"):
        Job("a", 1.0, 1.0, staleness=value).validate()


def test_trace_staleness_column_is_optional_and_checked(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"{HEADER}\na,0,8,8,10,4,0,0,1.5,7B,5\n")
    assert read_trace(path)[0].staleness == 0
    path.write_text(f"{HEADER},staleness\na,0,8,8,10,4,0,0,1.5,7B,5,2\nb,1,8,8,10,4,0,0,1.5,7B,5,\n")
    assert [j.staleness for j in read_trace(path)] == [2, 0]
    for bad, why in (("-1", "staleness=-1"), ("0.5", "not an integer")):
        path.write_text(f"{HEADER},staleness\na,0,8,8,10,4,0,0,1.5,7B,5,{bad}\n")
        with pytest.raises(TraceFormatError, match=why) as err:
            read_trace(path)
        assert err.value.column == "staleness"


def test_write_trace_adds_the_column_only_for_async_jobs(tmp_path):
    sync = [Job("a", 10.0, 4.0, iterations=3, model="7B")]
    write_trace(sync, tmp_path / "s.csv")
    assert "staleness" not in (tmp_path / "s.csv").read_text()
    jobs = sync + [Job("b", 10.0, 4.0, iterations=3, staleness=2, model="7B")]
    write_trace(jobs, tmp_path / "a.csv")
    assert read_trace(tmp_path / "a.csv") == jobs


def test_generator_marks_a_share_async_and_keeps_everything_else():
    base = generate(40, 7)
    mixed = generate(40, 7, async_share=0.3, staleness=2)
    marked = [m for m in mixed if m.staleness]
    assert len(marked) == 12 and all(m.staleness == 2 for m in marked)
    for b, m in zip(base, mixed):
        if m.staleness:
            assert m.iterations == b.solo_iterations()  # the same work
            m.iterations, m.staleness = b.iterations, 0
        assert m == b
    with pytest.raises(SpecError, match="async_share"):
        generate(3, 1, async_share=1.5)
    with pytest.raises(SpecError, match="staleness"):
        generate(3, 1, async_share=0.5, staleness=0)


def test_live_api_takes_async_jobs_and_refuses_a_bad_staleness_naming_it(tmp_path):
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                      switch_cost=SwitchCost("fixed"))
    service = Service(cluster, str(tmp_path / "state.db"), "admin-token-" + "x" * 24, ServiceConfig())
    spec = {"job_id": "a", "t_roll_s": 0.1, "t_train_s": 0.1, "iterations": 2}
    auth = {"Authorization": "Bearer admin-token-" + "x" * 24}
    with TestClient(create_app(service)) as client:
        r = client.post("/v1/jobs", json={"spec": {**spec, "staleness": 9}}, headers=auth)
        assert r.status_code == 422 and r.json()["field"] == "spec.staleness"
        assert client.post("/v1/jobs", json={"spec": {**spec, "staleness": 1}}, headers=auth).status_code == 201
        assert client.get("/v1/jobs/a", headers=auth).json()["staleness"] == 1


def test_simulate_table_lines_per_kind():
    jobs = [Job("a", 100.0, 20.0, staleness=1, iterations=10, model="7B"), Job("s", 20.0, 30.0, iterations=10)]
    results = [simulate(jobs, Cluster(), make_policy(p)) for p in ("rollmux", "solo-d")]
    lines = kind_lines(results)
    assert len(lines) == 2 and lines[1] == ("solo-d: sync 1 jobs: SLO met 100.0%, mean slowdown 1.000; "
                                            "async 1 jobs: SLO met 100.0%, mean slowdown 1.000")
    assert kind_lines([simulate(jobs[1:], Cluster(), make_policy("solo-d"))]) == []
