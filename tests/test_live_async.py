"""Asynchronous jobs (staleness k >= 1) under the live control plane.

The oracles do not trust the control plane's own bookkeeping: node exclusivity and the
staleness bound are checked from the committed event log (grants and finishes in
sequence order) and from the clients' own wall-clock spans; the order of grants is
checked by replaying the logged admit/finish/remove steps through a fresh
``GroupExecutor``; refusals compare every committed row and /v1/status before and after.
Every loop is bounded in count and time.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from collections import defaultdict

import pytest
from fastapi.testclient import TestClient

from loopback_server import ThreadServer
from rollmux import Client
from rollmux.execution import GroupExecutor
from rollmux.model import ROLLOUT, TRAIN, Cluster, Job, PoolSpec, SwitchCost
from rollmux.runtime.control import ControlPlane, PhaseOrderError, SpecRejected
from rollmux.runtime.service import Service, ServiceConfig, create_app

ADMIN = "live-async-admin"
K = 1


def _cluster() -> Cluster:
    return Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                   switch_cost=SwitchCost("fixed"))


def _spec(job_id: str, iterations: int, staleness: int = 0, t: float = 0.1) -> dict:
    return {"job_id": job_id, "t_roll_s": t, "t_train_s": t, "slo": 2.0, "iterations": iterations,
            "staleness": staleness}


# --- the oracles ----------------------------------------------------------------------

def check_log(events: list[dict], staleness: dict[str, int]) -> dict[str, list[dict]]:
    """From the event log alone: no node held by two grants at once; each asynchronous job's
    rollout r+1 granted only while r - t <= k, at most one phase per pool per job, a
    training only for a released rollout; each synchronous job alternating. Returns each
    job's grants in order."""
    holder: dict[str, tuple[str, str]] = {}       # node -> (job, pool)
    held: dict[tuple[str, str], list[str]] = {}   # (job, pool) -> nodes
    count = defaultdict(lambda: {"r": 0, "f": 0, "t": 0})
    grants: dict[str, list[dict]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["seq"]):
        job, pool = e["job_id"], e["pool"]
        c = count[job]
        if e["kind"] == "grant":
            assert (job, pool) not in held, f"{job} granted a second {pool} phase at once (seq {e['seq']})"
            for n in e["nodes"]:
                assert n not in holder, f"node {n} granted to {job} while {holder[n]} holds it (seq {e['seq']})"
                holder[n] = (job, pool)
            held[(job, pool)] = e["nodes"]
            k = staleness.get(job, 0)
            if pool == ROLLOUT:
                assert c["r"] - c["t"] <= k, f"{job}: rollout {c['r'] + 1} granted with {c['t']} trainings done"
                c["r"] += 1
            else:
                assert c["f"] > c["t"], f"{job}: training {c['t'] + 1} granted before its rollout was released"
            if k == 0:
                assert len([p for (j, p) in held if j == job]) == 1, f"{job}: synchronous, two phases at once"
                want = ROLLOUT if len(grants[job]) % 2 == 0 else TRAIN
                assert pool == want, f"{job}: synchronous job granted {pool} out of alternation"
            grants[job].append(e)
        elif e["kind"] == "finish":
            for n in held.pop((job, pool)):
                del holder[n]
            c["f" if pool == ROLLOUT else "t"] += 1
        elif e["kind"] == "remove":
            for p in (ROLLOUT, TRAIN):
                for n in held.pop((job, p), []):
                    del holder[n]
    return grants


def replay(events: list[dict]) -> dict[str, list[tuple]]:
    """Feed the logged admit/finish/remove steps of each group to a fresh executor; the
    grants it makes, per group, as (job, pool, nodes, at)."""
    executors: dict[str, GroupExecutor] = {}
    made: dict[str, list[tuple]] = defaultdict(list)
    last_at: dict[str, float] = {}

    def flush(gid: str) -> None:
        if gid in last_at:
            for g in executors[gid].dispatch(last_at.pop(gid)):
                made[gid].append((g.job_id, g.pool, list(g.nodes), g.start))

    for e in sorted(events, key=lambda e: e["seq"]):
        gid, d = e["group_id"], e["detail"]
        if e["kind"] in ("admit", "finish", "remove"):
            if gid in last_at and last_at[gid] != e["at"]:
                flush(gid)
            ex = executors.setdefault(gid, GroupExecutor())
            if e["kind"] == "admit":
                ex.admit(e["job_id"], tuple(d["rollout_nodes"]), tuple(d["train_nodes"]), e["at"], *d["switch"],
                         staleness=d.get("staleness", 0), rollouts=d.get("rollouts"))
            elif e["kind"] == "finish":
                ex.finish(e["job_id"], e["at"], requeue=d["requeue"], pool=e["pool"])
            else:
                ex.remove(e["job_id"])
            last_at[gid] = e["at"]
        elif e["kind"] == "grant":
            flush(gid)
    for gid in list(last_at):
        flush(gid)
    return made


def logged_grants(events: list[dict]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e["seq"]):
        if e["kind"] == "grant":
            out[e["group_id"]].append((e["job_id"], e["pool"], e["nodes"], e["at"]))
    return out


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


# --- in process: the control plane -----------------------------------------------------

def _plane() -> tuple[ControlPlane, str]:
    cp = ControlPlane(_cluster())
    rec = cp.submit(Job("a", t_roll_s=1.0, t_train_s=1.0, iterations=3, staleness=K), 0.0, "h")
    return cp, rec.group_id


def test_async_job_holds_a_rollout_and_a_training_at_once_within_its_bound():
    cp, gid = _plane()
    rec = cp.jobs["a"]
    assert rec.movable is False  # asynchronous jobs are never moved
    r1 = cp.acquire("a", ROLLOUT)
    with pytest.raises(PhaseOrderError, match="training 1 needs rollout 1"):
        cp.acquire("a", TRAIN)
    cp.release("a", ROLLOUT, r1.seq, 1.0, 1.0)
    r2, t1 = cp.acquire("a", ROLLOUT), cp.acquire("a", TRAIN)
    assert r2.nodes == rec.rollout_nodes and t1.nodes == rec.train_nodes and r2.granted_at == t1.granted_at == 1.0
    assert cp.executors[gid].busy_nodes() == {rec.rollout_nodes[0]: "a", rec.train_nodes[0]: "a"}
    from rollmux.cli_service import _jobs_table  # `rollmux status` lists both grants
    (row,) = [j for j in cp.status(1.0)["jobs"] if j["job_id"] == "a"]
    assert list(_jobs_table([row]).columns[-1].cells) == [
        f"rollout on {rec.rollout_nodes[0]}; train on {rec.train_nodes[0]}"]
    cp.release("a", ROLLOUT, r2.seq, 1.0, 2.0)
    with pytest.raises(PhaseOrderError, match="more than the job's staleness 1"):
        cp.acquire("a", ROLLOUT)  # rollout 3 with no training done would be 2 versions stale
    assert cp.release("a", ROLLOUT, r2.seq, 1.0, 2.5) is rec  # a retried release is answered, not re-applied
    assert rec.pipeline() == {"staleness": 1, "rollouts_started": 2, "rollouts_done": 2, "trainings_done": 0}
    cp.release("a", TRAIN, t1.seq, 1.0, 2.5)
    r3, t2 = cp.acquire("a", ROLLOUT), cp.acquire("a", TRAIN)
    assert r3 is not None and t2 is not None
    cp.release("a", ROLLOUT, r3.seq, 1.0, 3.5)
    with pytest.raises(PhaseOrderError, match="started all its 3 rollouts"):
        cp.acquire("a", ROLLOUT)
    cp.release("a", TRAIN, t2.seq, 1.0, 3.5)
    t3 = cp.acquire("a", TRAIN)
    cp.release("a", TRAIN, t3.seq, 1.0, 4.5)
    assert rec.state == "done" and rec.iterations_done == 3 and not cp.plan.groups
    events = cp.take_changes().events
    check_log(events, {"a": K})
    assert replay(events) == logged_grants(events)


def test_refused_async_calls_change_nothing():
    cp, gid = _plane()
    r1 = cp.acquire("a", ROLLOUT)
    cp.release("a", ROLLOUT, r1.seq, 1.0, 1.0)
    cp.take_changes()
    before = json.dumps(cp.snapshot(), sort_keys=True)
    r2, t1 = cp.acquire("a", ROLLOUT), cp.acquire("a", TRAIN)
    bad = [lambda: cp.release("a", TRAIN, r2.seq, 1.0, 2.0),       # the rollout's grant named as the training's
           lambda: cp.release("a", ROLLOUT, t1.seq, 1.0, 2.0),
           lambda: cp.release("a", ROLLOUT, 10**6, 1.0, 2.0),
           lambda: cp.release("a", ROLLOUT, r2.seq, float("nan"), 2.0),
           lambda: cp.tail("a", 1.5, 2.0)]
    for call in bad:
        with pytest.raises(Exception) as err:
            call()
        assert getattr(err.value, "field", None) in ("phase", "grant_seq", "duration_s", "fraction")
        assert json.dumps(cp.snapshot(), sort_keys=True) == before
        assert cp.take_changes().empty()
    with pytest.raises(SpecRejected, match="staleness"):
        cp.submit(Job("b", t_roll_s=1.0, t_train_s=1.0, staleness=9), 2.0, "h")
    assert cp.tail("a", 0.9, 2.0) == 8  # no hand-off for an asynchronous job (rule 12): it keeps its GPUs
    assert json.dumps(cp.snapshot(), sort_keys=True) == before


def test_a_restore_keeps_both_grants_the_counters_and_the_queues():
    cp, gid = _plane()
    s = cp.submit(Job("s", t_roll_s=1.0, t_train_s=1.0, iterations=2, slo=2.0), 0.0, "h")
    r1 = cp.acquire("a", ROLLOUT)
    cp.release("a", ROLLOUT, r1.seq, 1.0, 1.0)
    snap = json.loads(json.dumps(cp.snapshot()))
    back = ControlPlane.restore(snap)
    assert json.dumps(back.snapshot(), sort_keys=True) == json.dumps(snap, sort_keys=True)
    ex, ex2 = cp.executors[gid], back.executors[gid]
    assert ex2.pipeline("a") == ex.pipeline("a") == (2, 1, 0)
    assert ex2.busy_nodes() == ex.busy_nodes() and set(ex2.running_pools("a")) == {ROLLOUT, TRAIN}
    assert [g.pool for g in back.jobs["a"].grants] == [ROLLOUT, TRAIN]
    # both go on identically: the same grants at the same steps
    for plane in (cp, back):
        rec = plane.jobs["a"]
        plane.release("a", ROLLOUT, rec.held(ROLLOUT).seq, 1.0, 2.0)
        plane.release("a", TRAIN, rec.held(TRAIN).seq, 1.0, 2.2)
    assert [(g.pool, g.seq, g.granted_at) for g in cp.jobs["a"].grants] == \
           [(g.pool, g.seq, g.granted_at) for g in back.jobs["a"].grants]
    assert cp.jobs[s.job_id].grant == back.jobs[s.job_id].grant


def test_a_lost_lease_frees_both_pools():
    cp, gid = _plane()
    r1 = cp.acquire("a", ROLLOUT)
    cp.release("a", ROLLOUT, r1.seq, 1.0, 1.0)
    assert len(cp.jobs["a"].grants) == 2 and cp.outstanding_grants() == 2
    assert cp.expire(["a"], 1.5, "lease") == ["a"]
    assert cp.jobs["a"].state == "expired" and cp.jobs["a"].grants == [] and cp.outstanding_grants() == 0
    assert gid not in cp.executors and not cp.plan.groups  # its nodes went back
    assert cp.busy_s[ROLLOUT] == pytest.approx(0.5 + 1.0) and cp.busy_s[TRAIN] == pytest.approx(0.5)


# --- over HTTP: hostile requests ----------------------------------------------------------

@pytest.fixture
def api(tmp_path):
    service = Service(_cluster(), str(tmp_path / "state.db"), ADMIN, ServiceConfig(lease_s=30.0, grace_s=5.0))
    with TestClient(create_app(service)) as client:
        r = client.post("/v1/jobs", json={"spec": _spec("a", 3, staleness=K)}, headers=_auth(ADMIN))
        assert r.status_code == 201, r.text
        assert r.json()["staleness"] == K and r.json()["movable"] is False
        yield client, service, r.json()["token"]


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _persisted(client: TestClient, service: Service) -> str:
    status = client.get("/v1/status", headers=_auth(ADMIN)).json()
    status.pop("now")
    status.pop("overdue")  # (a reading of the clock against the grants, as "now" is: not state)
    return service.store.dump() + json.dumps(status, sort_keys=True)


@pytest.mark.parametrize("value", [9, -1, 100, True, 1.5, "1"])
def test_a_bad_staleness_is_refused_naming_the_field(api, value):
    client, service, _ = api
    before = _persisted(client, service)
    r = client.post("/v1/jobs", json={"spec": _spec("x", 3, staleness=value)}, headers=_auth(ADMIN))
    assert r.status_code == 422 and r.json()["field"] == "spec.staleness", r.text
    assert _persisted(client, service) == before


def test_out_of_bound_phase_requests_get_409_and_change_nothing(api):
    client, service, token = api
    job = _auth(token)

    def call(path: str, body: dict):
        return client.post(f"/v1/jobs/a/{path}", json=body, headers=job)

    def refused(path: str, body: dict, status: int, field: str) -> None:
        before = _persisted(client, service)
        r = call(path, body)
        assert r.status_code == status and r.json()["field"] == field, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert _persisted(client, service) == before

    refused("acquire", {"phase": "train"}, 409, "phase")  # no rollout released yet
    r1 = call("acquire", {"phase": "rollout"}).json()["grant"]
    refused("release", {"phase": "train", "grant_seq": r1["seq"], "duration_s": 0.1}, 409, "phase")
    assert call("release", {"phase": "rollout", "grant_seq": r1["seq"], "duration_s": 0.1}).status_code == 200
    r2 = call("acquire", {"phase": "rollout"}).json()
    t1 = call("acquire", {"phase": "train"}).json()
    assert r2["granted"] and t1["granted"]
    assert {g["pool"] for g in t1["job"]["grants"]} == {"rollout", "train"}
    assert t1["job"]["pipeline"] == {"staleness": 1, "rollouts_started": 2, "rollouts_done": 1, "trainings_done": 0}
    refused("release", {"phase": "rollout", "grant_seq": t1["grant"]["seq"], "duration_s": 0.1}, 409, "grant_seq")
    assert call("release", {"phase": "rollout", "grant_seq": r2["grant"]["seq"], "duration_s": 0.1}).status_code == 200
    refused("acquire", {"phase": "rollout"}, 409, "phase")  # rollout 3 would be 2 versions stale (k = 1)
    refused("acquire", {"phase": "rollout", "wait_s": 0.2}, 409, "phase")
    # a retried release of the rollout (the training's still held) is answered, not re-applied
    before = _persisted(client, service)
    assert call("release", {"phase": "rollout", "grant_seq": r2["grant"]["seq"], "duration_s": 0.1}).status_code == 200
    assert _persisted(client, service) == before


# --- a real service on 127.0.0.1: an async and a sync job, two threads, a restart ------------

@pytest.fixture
def srv(tmp_path):
    server = ThreadServer(_cluster(), str(tmp_path / "state.db"), ADMIN, lease_s=2.0, grace_s=1.0)
    server.start()
    yield server
    server.stop()


def run_async_job(job, iterations: int, roll_s: float, train_s: float, on_train=None, timeout_s: float = 60.0) -> None:
    """The two-thread loop of an asynchronous job: rollouts in a thread, trainings here."""
    batches: queue.Queue = queue.Queue()
    error: list[BaseException] = []

    def rollouts() -> None:
        try:
            for i in range(iterations):
                with job.phase("rollout", timeout_s=timeout_s):
                    time.sleep(roll_s)
                batches.put(i)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            error.append(exc)
            batches.put(None)

    thread = threading.Thread(target=rollouts, daemon=True)
    thread.start()
    for i in range(iterations):
        got = batches.get(timeout=timeout_s)
        if got is None:
            raise error[0]
        assert got == i
        with job.phase("train", timeout_s=timeout_s):
            time.sleep(train_s)
        if on_train is not None:
            on_train(i)
    thread.join(timeout_s)
    assert not thread.is_alive() and not error


def run_sync_job(job, iterations: int, phase_s: float) -> None:
    for _ in range(iterations):
        for name in ("rollout", "train"):
            with job.phase(name):
                time.sleep(phase_s)


def _spans(job) -> dict[str, list[tuple[float, float]]]:
    out = defaultdict(list)
    for name, _nodes, _seq, start, end in job.history:
        out[name].append((start, end))
    return out


def _check_runs(url: str, jobs: dict, n: int) -> list[dict]:
    admin = Client(url, ADMIN)
    try:
        events = admin.events(0)
        finals = {j: admin.job(j) for j in jobs}
    finally:
        admin.close()
    grants = check_log(events, {"a": K, "s": 0})
    assert replay(events) == logged_grants(events)
    for j, view in finals.items():
        assert view["state"] == "done" and view["iterations_done"] == n, view
    # the clients' own spans: on each node, never two phases at once
    per_node = defaultdict(list)
    for job in jobs.values():
        for name, nodes, _seq, start, end in job.history:
            for node in nodes:
                per_node[node].append((start, end, job.job_id, name))
    for node, spans in per_node.items():
        spans.sort()
        for (s0, e0, j0, p0), (s1, e1, j1, p1) in zip(spans, spans[1:]):
            assert e0 <= s1, f"{node}: {j0} {p0} [{s0}, {e0}] overlaps {j1} {p1} [{s1}, {e1}]"
    # the async job: rollout i+1 overlapped training i (both granted at rollout i's release)
    a = _spans(jobs["a"])
    assert len(a["rollout"]) == len(a["train"]) == n
    overlap = [overlaps(a["rollout"][i + 1], a["train"][i]) for i in range(n - 1)]
    assert sum(overlap) > 0 and max(overlap) > 0
    pairs = [(g["pool"], g["at"]) for g in grants["a"]]
    assert sum(1 for i in range(1, len(pairs)) if pairs[i][1] == pairs[i - 1][1] and
               {pairs[i][0], pairs[i - 1][0]} == {ROLLOUT, TRAIN}) >= 1
    # the sync job: strictly alternating, its own phases never overlapping
    s = jobs["s"].history
    assert [h[0] for h in s] == ["rollout", "train"] * n
    assert all(e0 <= s1 for (_, _, _, _, e0), (_, _, _, s1, _) in zip(s, s[1:]))
    return events


def test_an_async_and_a_sync_job_under_a_live_service(srv):
    n = 5
    client = Client(srv.url, ADMIN, poll_s=2.0)
    try:
        a = client.submit(_spec("a", n, staleness=K, t=0.15))
        s = client.submit(_spec("s", n, t=0.1))
        assert a.wait_placed(10) and s.wait_placed(10)
        assert a.staleness == K and s.staleness == 0
        sync = threading.Thread(target=run_sync_job, args=(s, n, 0.1), daemon=True)
        sync.start()
        run_async_job(a, n, 0.15, 0.15)
        sync.join(60)
        assert not sync.is_alive()
        _check_runs(srv.url, {"a": a, "s": s}, n)
    finally:
        client.close()


def test_a_restart_mid_run_loses_nothing(srv):
    """The service is stopped while the async job holds a rollout and a training (after its
    second training) and restarted on the same state file: both jobs finish, and the log
    across the restart passes every check."""
    n = 5
    client = Client(srv.url, ADMIN, poll_s=1.0, give_up_s=30.0)
    restarted = threading.Event()

    def restart(i: int) -> None:
        if i == 1 and not restarted.is_set():
            srv.stop()
            before = srv.service.control.snapshot()  # nothing changes while it is down
            srv.open()  # restored, not serving yet: the clients (retrying meanwhile) cannot change it
            after = srv.service.control.snapshot()
            srv.serve()
            assert srv.service.restored
            assert after["jobs"] == before["jobs"] and after["groups"] == before["groups"]
            restarted.set()

    try:
        a = client.submit(_spec("a", n, staleness=K, t=0.15))
        s = client.submit(_spec("s", n, t=0.1))
        assert a.wait_placed(10) and s.wait_placed(10)
        sync = threading.Thread(target=run_sync_job, args=(s, n, 0.1), daemon=True)
        sync.start()
        run_async_job(a, n, 0.15, 0.15, on_train=restart)
        sync.join(60)
        assert not sync.is_alive() and restarted.is_set()
        _check_runs(srv.url, {"a": a, "s": s}, n)
    finally:
        client.close()


def test_a_handle_attached_mid_run_picks_up_the_pipeline(srv):
    """A client restart: a new handle on the job (``attach``) starts from the service's
    counters, so it neither repeats a rollout nor waits for one that was released."""
    n = 3
    client = Client(srv.url, ADMIN, poll_s=1.0)
    try:
        first = client.submit(_spec("a", n, staleness=K, t=0.05))
        first.wait_placed(10)
        with first.phase("rollout", timeout_s=10):
            pass
        first.close()
        job = client.attach("a", first.token)
        assert (job._started, job._rolled, job._trained) == (1, 1, 0)
        done = []

        def rollouts() -> None:
            for _ in range(n - 1):
                with job.phase("rollout", timeout_s=20) as ph:
                    done.append(ph.grant["seq"])

        thread = threading.Thread(target=rollouts, daemon=True)
        thread.start()
        for _ in range(n):
            with job.phase("train", timeout_s=20):
                time.sleep(0.05)
        thread.join(20)
        assert not thread.is_alive() and len(done) == n - 1
        view = client.job("a")
        assert view["state"] == "done" and view["iterations_done"] == n
        assert view["pipeline"] == {"staleness": K, "rollouts_started": n, "rollouts_done": n, "trainings_done": n}
        check_log(client.events(0), {"a": K})
    finally:
        client.close()


def test_a_silent_async_job_loses_both_grants(srv):
    """No heartbeat while it holds a rollout and a training: the lease runs out, the job
    expires, both pools' nodes go back, nothing else changes."""
    client = Client(srv.url, ADMIN, poll_s=1.0)
    try:
        job = client.submit(_spec("a", 3, staleness=K), heartbeat=False)
        job.wait_placed(10)
        r1 = job.phase("rollout", timeout_s=10)
        r1.__enter__()
        r1.__exit__(None, None, None)
        job.phase("rollout", timeout_s=10).__enter__()
        job.phase("train", timeout_s=10).__enter__()
        status = client.status()
        assert sorted(status["groups"][0]["holders"]) == sorted(job.placement["rollout_nodes"]
                                                                + job.placement["train_nodes"])
        deadline = time.monotonic() + 15  # lease 2 s + grace 1 s, checked every 0.5 s
        while client.job("a")["state"] != "expired":
            assert time.monotonic() < deadline, "the silent job did not expire"
            time.sleep(0.2)
        status = client.status()
        assert status["groups"] == [] and client.job("a")["grants"] == []
    finally:
        client.close()
