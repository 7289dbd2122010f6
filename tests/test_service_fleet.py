"""``rollmux serve`` on a fleet file, end to end: real processes, real sockets, kill -9
and restart. Jobs run on the pairs of GPU types the fleet planner chose, every node is a
physical node of one pool, no node is granted to two jobs at once, the fleet and its
profiles survive the restart, and a restart that would change them is refused. Which
views the jobs take depends on the order their processes submit in; the checks hold for
any order."""
from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from test_service_e2e import ADMIN, ROLLMUX, Server, _assert_exclusive, _grant_intervals, _spawn, _wait_all
from test_service_hostile import _auth, _config, _persisted

FLEET_YAML = """\
gpus_per_node: 8
switch_cost_s: 0
pools:
  - {gpu: H20, nodes: 2}
  - {gpu: H800, nodes: 2}
  - {gpu: H200, nodes: 2}
"""
# "b" decodes faster on H200 than the roofline rule says
# "hopeless" decodes 100x slower than its spec says on every type: no pair meets its SLO
PROFILES_CSV = ("job_id,gpu,t_roll_s,t_train_s\nb,H200,0.02,\n"
                + "".join(f"hopeless,{gpu},10.0,\n" for gpu in ("H20", "H800", "H200")))


class FleetServer(Server):
    def __init__(self, tmp, lease_s: float, extra: tuple[str, ...] = ()) -> None:
        super().__init__(tmp, lease_s)
        (tmp / "fleet.yaml").write_text(FLEET_YAML)
        (tmp / "profiles.csv").write_text(PROFILES_CSV)
        self.args[self.args.index("--cluster") + 1] = str(tmp / "fleet.yaml")
        self.args += ["--profiles", str(tmp / "profiles.csv"), *extra]


def _spec(job_id: str, slo: float = 2.0) -> dict:
    return {"job_id": job_id, "t_roll_s": 0.1, "t_train_s": 0.1, "slo": slo, "iterations": 4}


def _refused(args: list[str], env: dict) -> str:
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    return " ".join((out.stdout + out.stderr).split())


def test_a_fleet_served_end_to_end_survives_kill_and_restart(tmp_path):
    srv = FleetServer(tmp_path, lease_s=20.0)
    srv.start()
    try:
        procs = [_spawn(tmp_path, srv.url, _spec(j), 0.05)[0] for j in ("a", "b", "c")]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(srv.admin("/status")["jobs"]) < 3:
            time.sleep(0.1)
        status = srv.admin("/status")
        assert set(status["nodes"]) == {"H20", "H800", "H200"} and len(status["jobs"]) == 3
        assert all(g["view"] == g["group_id"].split(":", 1)[0] for g in status["groups"])
        srv.kill()
        srv.start()  # the same state file, fleet and profiles
        _wait_all(procs, 60)
        assert all(p.returncode == 0 for p in procs), [p.stderr.read().decode()[-500:] for p in procs]
        events = srv.admin("/events?limit=10000")
        grants = [e for e in events if e["kind"] == "grant"]
        nodes = {n for e in grants for n in e["nodes"]}
        assert nodes <= {f"{pool}-{i}" for pool in ("H20", "H800", "H200") for i in range(2)}
        for e in grants:  # a phase runs on nodes of its group's type for that side
            rollout_type, train_type = e["group_id"].split(":", 1)[0].split("/")
            want = rollout_type if e["pool"] == "rollout" else train_type
            assert all(n.rsplit("-", 1)[0] == want for n in e["nodes"]), e
        _assert_exclusive(_grant_intervals(events))
        done = {j["job_id"]: j for j in srv.admin("/status")["jobs"]}
        assert all(done[j]["state"] == "done" and done[j]["iterations_done"] == 4 for j in ("a", "b", "c"))
    finally:
        if srv.proc and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(5)
    # a restart that would change the fleet, its profiles or ask for a policy it cannot run is refused
    (tmp_path / "other.yaml").write_text(FLEET_YAML.replace("nodes: 2}\n  - {gpu: H200", "nodes: 3}\n  - {gpu: H200"))
    base = [a for a in srv.args if a not in ("--profiles", str(tmp_path / "profiles.csv"))]
    changed = list(base)
    changed[changed.index("--cluster") + 1] = str(tmp_path / "other.yaml")
    assert "pools:" in _refused(changed, srv.env) and "fleet differs" in _refused(changed, srv.env)
    (tmp_path / "p2.csv").write_text("job_id,gpu,t_roll_s,t_train_s\nb,H200,0.05,\n")
    assert "profiles" in _refused([*base, "--profiles", str(tmp_path / "p2.csv")], srv.env)
    assert "runs rollmux" in _refused([*srv.args, "--policy", "rollmux-consolidate"], srv.env)


def test_rollmux_hedge_served_on_a_two_pool_cluster_survives_kill_and_restart(tmp_path):
    """``rollmux serve --policy rollmux-hedge --cluster two-pool.yaml``: planned as a fleet of
    one pair of types, the jobs run to their end through a kill -9 and a restart with the
    same cluster file, on nodes named by pool, never two at once on a node."""
    srv = Server(tmp_path, lease_s=20.0)
    srv.args += ["--policy", "rollmux-hedge"]
    srv.start()
    try:
        procs = [_spawn(tmp_path, srv.url, _spec(j), 0.05)[0] for j in ("a", "b")]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(srv.admin("/status")["jobs"]) < 2:
            time.sleep(0.1)
        srv.kill()
        srv.start()  # the same state file and cluster file: the same fleet of one view
        _wait_all(procs, 60)
        assert all(p.returncode == 0 for p in procs), [p.stderr.read().decode()[-500:] for p in procs]
        events = srv.admin("/events?limit=10000")
        nodes = {n for e in events if e["kind"] == "grant" for n in e["nodes"]}
        assert nodes and nodes <= {f"{pool}-{i}" for pool in ("rollout", "train") for i in range(4)}
        _assert_exclusive(_grant_intervals(events))
        done = {j["job_id"]: j for j in srv.admin("/status")["jobs"]}
        assert all(done[j]["state"] == "done" and done[j]["iterations_done"] == 4 for j in ("a", "b"))
    finally:
        if srv.proc and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(5)


def test_rollmux_hedge_answers_a_submit_before_the_gathering_it_then_runs_by_itself(tmp_path):
    """An in-process ``rollmux-hedge`` service on two pools: job b opens a group and is
    answered with it; the gathering with job a alone then runs on its own (no other
    request asks for it) and its regrouping is persisted."""
    from fastapi.testclient import TestClient

    from rollmux.model import Cluster
    from rollmux.runtime.service import Service, create_app

    service = Service(Cluster(), str(tmp_path / "state.db"), ADMIN, _config(policy="rollmux-hedge"))
    spec = {"t_roll_s": 100.0, "t_train_s": 100.0, "slo": 1.5, "iterations": 1000}
    with TestClient(create_app(service)) as client:
        for job_id in ("a", "b"):
            answer = client.post("/v1/jobs", json={"spec": {"job_id": job_id, **spec}}, headers=_auth(ADMIN))
            assert answer.status_code == 201, answer.text
            assert answer.json()["placement"] is not None, answer.text  # placed at once
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not service.control.regroups:
            time.sleep(0.05)
        regroupings = client.get("/v1/status", headers=_auth(ADMIN)).json()["regroupings"]
        assert [sorted(r["members"]) for r in regroupings] == [["a", "b"]]
        assert not service.control.gathers_pending
        assert service.store.load()["globals"]["regroups"]  # committed


def test_changes_are_answered_while_a_regrouping_is_decided_off_the_lock(tmp_path):
    """The service decides regroupings apart (the default): while the policy is held
    inside a decision, a submit, a progress report and the status are answered, and the
    regrouping is carried out (and committed) once the decision returns. Under
    ``--regroup-decisions locked`` the same decision is made in the submit itself."""
    import threading

    from fastapi.testclient import TestClient

    from rollmux.model import Cluster
    from rollmux.runtime.service import Service, create_app

    spec = {"t_roll_s": 100.0, "t_train_s": 100.0, "slo": 1.5, "iterations": 1000}
    locked = Service(Cluster(), str(tmp_path / "locked.db"), ADMIN, _config(policy="rollmux-hedge",
                                                                            decide_apart=False))
    assert not locked.control.decide_apart
    locked.close()
    service = Service(Cluster(), str(tmp_path / "state.db"), ADMIN, _config(policy="rollmux-hedge"))
    assert service.control.decide_apart
    real, entered, gate = service.control._regroup, threading.Event(), threading.Event()

    def held(*args, **kw):
        entered.set()
        assert gate.wait(30), "the test never let the decision go"
        return real(*args, **kw)

    service.control._regroup = held
    with TestClient(create_app(service)) as client:
        answer = client.post("/v1/jobs", json={"spec": {"job_id": "a", **spec}}, headers=_auth(ADMIN))
        assert answer.status_code == 201, answer.text
        token = answer.json()["token"]
        assert entered.wait(10), "a's arrival asks for a regrouping"
        t0 = time.monotonic()
        answer = client.post("/v1/jobs", json={"spec": {"job_id": "b", **spec}}, headers=_auth(ADMIN))
        assert answer.status_code == 201 and answer.json()["placement"] is not None, answer.text
        assert client.post("/v1/jobs/a/progress", json={"fraction": 0.5}, headers=_auth(token)).status_code == 200
        status = client.get("/v1/status", headers=_auth(ADMIN)).json()
        assert time.monotonic() - t0 < 10 and status["regroupings"] == [] and not gate.is_set()
        gate.set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not service.control.regroups:
            time.sleep(0.05)
        regroupings = client.get("/v1/status", headers=_auth(ADMIN)).json()["regroupings"]
        assert [sorted(r["members"]) for r in regroupings] == [["a", "b"]]
        assert service.store.load()["globals"]["regroups"]  # committed
        metrics = client.get("/metrics").text
        assert "rollmux_regroup_decide_seconds_count" in metrics


@pytest.mark.parametrize("case", ["profiles without a fleet", "policy", "bad profile row"])
def test_serve_refuses_a_bad_fleet_start_and_writes_no_state(tmp_path, case):
    (tmp_path / "fleet.yaml").write_text(FLEET_YAML)
    (tmp_path / "cluster.yaml").write_text("rollout: {nodes: 2}\ntrain: {nodes: 2}\n")
    (tmp_path / "profiles.csv").write_text(PROFILES_CSV)
    (tmp_path / "bad.csv").write_text("job_id,gpu,t_roll_s,t_train_s\nb,H999,0.02,\n")
    state = tmp_path / "state.db"
    args = {"profiles without a fleet": ["--cluster", str(tmp_path / "cluster.yaml"),
                                         "--profiles", str(tmp_path / "profiles.csv")],
            "policy": ["--cluster", str(tmp_path / "fleet.yaml"), "--policy", "rollmux-host"],
            "bad profile row": ["--cluster", str(tmp_path / "fleet.yaml"), "--profiles", str(tmp_path / "bad.csv")]}
    said = _refused([ROLLMUX, "serve", "--state", str(state), "--port", "1", *args[case]],
                    {"ROLLMUX_ADMIN_TOKEN": ADMIN, "PATH": "/usr/bin:/bin"})
    expected = {"profiles without a fleet": "--profiles",
                "policy": "--policy 'rollmux-host': on a fleet of GPU types the live service runs rollmux",
                "bad profile row": "line 2"}[case]
    assert expected in said, said
    assert not state.exists()
    with pytest.raises(httpx.TransportError):
        httpx.get("http://127.0.0.1:1/healthz", timeout=0.2)


@pytest.fixture
def fleet_api(tmp_path):
    """An in-process service on the fleet file with job "a" placed: (client, service)."""
    from fastapi.testclient import TestClient

    from rollmux.fleet import load_profiles
    from rollmux.fleet_file import load_fleet
    from rollmux.runtime.service import Service, create_app

    (tmp_path / "fleet.yaml").write_text(FLEET_YAML)
    (tmp_path / "profiles.csv").write_text(PROFILES_CSV)
    fleet = load_fleet(tmp_path / "fleet.yaml")
    service = Service(fleet, str(tmp_path / "state.db"), ADMIN, _config(),
                      profiles=load_profiles(tmp_path / "profiles.csv", fleet))
    with TestClient(create_app(service)) as client:
        assert client.post("/v1/jobs", json={"spec": _spec("a")}, headers=_auth(ADMIN)).status_code == 201
        yield client, service


def test_a_fleet_service_refuses_hostile_requests_and_changes_nothing(fleet_api):
    client, service = fleet_api
    before = _persisted(client, service)
    too_wide = client.post("/v1/jobs", json={"spec": {**_spec("wide"), "rollout_gpus": 24}}, headers=_auth(ADMIN))
    assert too_wide.status_code == 422
    assert too_wide.json()["field"] == "spec.rollout_gpus" and "largest rollout pool" in too_wide.json()["detail"]
    hopeless = client.post("/v1/jobs", json={"spec": _spec("hopeless")}, headers=_auth(ADMIN))
    assert hopeless.status_code == 422 and hopeless.json()["field"] == "slo", hopeless.text
    assert "no view can take it" in hopeless.json()["detail"]
    add = client.post("/v1/admin/nodes", json={"pool": "rollout"}, headers=_auth(ADMIN))
    assert add.status_code == 400 and add.json()["field"] == "pool", add.text
    unknown = client.post("/v1/admin/nodes/R0/drain", headers=_auth(ADMIN))
    assert unknown.status_code == 404 and unknown.json()["field"] == "node", unknown.text
    assert _persisted(client, service) == before
    drained = client.post("/v1/admin/nodes/H200-1/drain", headers=_auth(ADMIN))
    assert drained.status_code == 200 and client.get("/v1/status", headers=_auth(ADMIN)).json()["drained"] == [
        "H200-1"]


def test_a_fleet_services_metrics_count_nodes_per_gpu_pool(fleet_api):
    client, _ = fleet_api
    text = client.get("/metrics").text
    status = client.get("/v1/status", headers=_auth(ADMIN)).json()
    (group,) = status["groups"]
    held = {n.rsplit("-", 1)[0] for n in (*group["rollout_nodes"], *group["train_nodes"])}
    for pool in ("H20", "H800", "H200"):
        expected = sum(n.startswith(pool + "-") for n in (*group["rollout_nodes"], *group["train_nodes"]))
        assert f'rollmux_nodes_in_use{{pool="{pool}"}} {float(expected)}' in text, text
    assert len(held) == 2  # a rollout pool and a training pool
