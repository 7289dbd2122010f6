"""The control plane under hostile input, wrong credentials and faults.

Every refusal asserts the status, that the answer is a problem document naming the
field, and that the state (every committed row and /v1/status) is byte-identical
afterwards. Faults: a failed commit, a second server on the file, a damaged file,
clock jumps (injected clocks), a slow network (a delaying proxy), a heavy submit
while heartbeats arrive.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from loopback_server import LoseAnswer, free_port

from rollmux import Client
from rollmux.model import Cluster, PoolSpec, SwitchCost
from rollmux.runtime.auth import Quota
from rollmux.runtime.clock import ServiceClock
from rollmux.runtime.sdk import JobCancelled, LeaseLost
from rollmux.runtime.service import Service, ServiceConfig, create_app, server_config
from rollmux.runtime.store import StateLocked, hash_token

ADMIN = "admin-secret"
TENANT = "tenant-a-secret-token"
ROLLMUX = str(Path(sys.executable).with_name("rollmux"))


def _cluster(nodes: int | None = 2) -> Cluster:
    return Cluster(rollout=PoolSpec("H20", 1.85, nodes=nodes), train=PoolSpec("H800", 5.28, nodes=nodes),
                   switch_cost=SwitchCost("fixed"))


def _spec(job_id: str, iterations: int = 3, t: float = 0.1, **extra) -> dict:
    return {"job_id": job_id, "t_roll_s": t, "t_train_s": t, "slo": 2.0, "iterations": iterations, **extra}


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}".encode("utf-8")}  # bytes: any token, as a client may send it


def _config(**kw) -> ServiceConfig:
    return ServiceConfig(**{"lease_s": 30.0, "grace_s": 5.0, "tenants": {"team-a": hash_token(TENANT)}, **kw})


@pytest.fixture
def api(tmp_path):
    service = Service(_cluster(), str(tmp_path / "state.db"), ADMIN, _config())
    with TestClient(create_app(service)) as client:
        first = client.post("/v1/jobs", json={"spec": _spec("a")}, headers=_auth(ADMIN))
        assert first.status_code == 201
        yield client, service, first.json()["token"]


def _persisted(client: TestClient, service: Service) -> str:
    status = client.get("/v1/status", headers=_auth(ADMIN)).json()
    status.pop("now")
    status.pop("overdue")  # (a reading of the clock against the grants, as "now" is: not state)
    return service.store.dump() + json.dumps(status, sort_keys=True)


def _assert_problem(r: httpx.Response, status: int, field: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["status"] == status and body["field"] == field and body["reason"] and body["title"], body
    assert body["detail"].startswith(field)


BIG = "x" * 1_000_000
HOSTILE = [
    # (method, path, body or raw bytes, token, status, field)
    ("post", "/v1/jobs", {"spec": _spec("x")}, None, 401, "authorization"),
    ("post", "/v1/jobs", {"spec": _spec("x")}, "job", 403, "authorization"),
    ("post", "/v1/jobs", {"spec": _spec("x")}, "wrong", 403, "authorization"),
    ("post", "/v1/jobs", {"spec": _spec("x")}, "tökén-ß", 403, "authorization"),
    ("post", "/v1/jobs", {"spec": _spec("x", rollout_gpus=8000)}, "admin", 422, "spec.rollout_gpus"),
    ("post", "/v1/jobs", {"spec": _spec("x", rollout_gpus=24000)}, "admin", 422, "spec.rollout_gpus"),
    ("post", "/v1/jobs", {"spec": _spec("x", train_gpus=80000)}, "admin", 422, "spec.train_gpus"),
    ("post", "/v1/jobs", {"spec": _spec("x", rollout_gpus=True)}, "admin", 422, "spec.rollout_gpus"),
    ("post", "/v1/jobs", {"spec": _spec("x", iterations=True)}, "admin", 422, "spec.iterations"),
    ("post", "/v1/jobs", {"spec": _spec("x", slo=True)}, "admin", 422, "spec.slo"),
    ("post", "/v1/jobs", {"spec": _spec("x", t="10")}, "admin", 422, "spec.t_roll_s"),
    ("post", "/v1/jobs", {"spec": _spec("x", slo="2")}, "admin", 422, "spec.slo"),
    ("post", "/v1/jobs", {"spec": _spec("x", rollout_gpus=8.5)}, "admin", 422, "spec.rollout_gpus"),
    ("post", "/v1/jobs", {"spec": _spec("x", t=1e308)}, "admin", 422, "spec.t_roll_s"),
    ("post", "/v1/jobs", b'{"spec": {"job_id": "x", "t_roll_s": Infinity, "t_train_s": 1}}', "admin", 422,
     "spec.t_roll_s"),
    ("post", "/v1/jobs", b'{"spec": {"job_id": "x", "t_roll_s": NaN, "t_train_s": 1}}', "admin", 422,
     "spec.t_roll_s"),
    ("post", "/v1/jobs", {"spec": _spec("x", duration_s=1e9)}, "admin", 422, "spec.duration_s"),
    ("post", "/v1/jobs", {"spec": _spec("x", mem_roll_gb=-1)}, "admin", 422, "spec.mem_roll_gb"),
    ("post", "/v1/jobs", {"spec": _spec("x", mem_roll_gb=5000)}, "admin", 422, "spec.mem_roll_gb"),
    ("post", "/v1/jobs", {"spec": _spec("x", slo=0.5)}, "admin", 422, "spec.slo"),
    ("post", "/v1/jobs", {"spec": _spec("x", t_roll_s=5e-324)}, "admin", 422, "spec.t_roll_s"),  # < 1 tick
    ("post", "/v1/jobs", {"spec": _spec("x", model="m" * 129)}, "admin", 422, "spec.model"),
    ("post", "/v1/jobs", {"spec": _spec("x", model="a\nb")}, "admin", 422, "spec.model"),
    ("post", "/v1/jobs", {"spec": _spec("x", model=BIG)}, "admin", 413, "body"),
    ("post", "/v1/jobs", {"spec": _spec("p/../q")}, "admin", 422, "spec.job_id"),
    ("post", "/v1/jobs", {"spec": _spec("..")}, "admin", 422, "spec.job_id"),
    ("post", "/v1/jobs", {"spec": _spec("a\nb")}, "admin", 422, "spec.job_id"),
    ("post", "/v1/jobs", {"spec": _spec("")}, "admin", 422, "spec.job_id"),
    ("post", "/v1/jobs", {"spec": _spec("j" * 129)}, "admin", 422, "spec.job_id"),
    ("post", "/v1/jobs", {"spec": _spec("x", colour="red")}, "admin", 422, "spec.colour"),
    ("post", "/v1/jobs", {"spec": _spec("x", tail_workers=9)}, "admin", 422, "spec.tail_workers"),
    ("post", "/v1/jobs", {"spec": _spec("x", tail_workers=0)}, "admin", 422, "spec.tail_workers"),
    ("post", "/v1/jobs", {"spec": {"job_id": "x", "t_roll_s": 1.0}}, "admin", 422, "spec.t_train_s"),
    ("post", "/v1/jobs", {"spec": _spec("x"), "token": "short"}, "admin", 422, "token"),
    ("post", "/v1/jobs", {"spec": _spec("a")}, "admin", 409, "job_id"),
    ("post", "/v1/jobs", b"{not json", "admin", 422, "body"),
    ("post", "/v1/jobs", b'{"spec": {"job_id": "x", "t_roll_s": 1, "t_train_s": 1}, "spec": {"job_id": "y", '
                         b'"t_roll_s": 1, "t_train_s": 1}}', "admin", 400, "body"),
    ("post", "/v1/jobs", b'{"spec": {"job_id": "x", "t_roll_s": 1, "t_roll_s": 9, "t_train_s": 1}}', "admin", 400,
     "body"),
    ("post", "/v1/jobs", b"[]", "admin", 422, "body"),
    ("post", "/v1/jobs", b'{"spec": {"job_id": "\xff\xfe"}}', "admin", 400, "body"),
    ("post", "/v1/jobs", b"[" * 30000 + b"]" * 30000, "admin", 400, "body"),
    ("get", "/v1/events?since=1000000000000000000000000000000", None, "admin", 422, "since"),
    ("get", "/v1/events?since=-1", None, "admin", 422, "since"),
    ("get", "/v1/jobs?state=running", None, "admin", 422, "state"),
    ("get", "/v1/jobs?limit=0", None, "admin", 422, "limit"),
    ("get", "/v1/status", None, None, 401, "authorization"),
    ("get", "/v1/status", None, "job", 403, "authorization"),
    ("get", "/v1/status", None, "tenant", 403, "authorization"),
    ("get", "/v1/jobs", None, "job", 403, "authorization"),
    ("post", "/v1/admin/nodes/R1/drain", None, "job", 403, "authorization"),
    ("post", "/v1/admin/nodes/Z9/drain", None, "admin", 404, "node"),
    ("post", "/v1/admin/nodes", {"pool": "rollout", "node_id": "R7"}, "admin", 400, "node_id"),
    ("post", "/v1/admin/nodes", {"pool": "gpu"}, "admin", 422, "pool"),
    ("post", "/v1/jobs/a/acquire", {"phase": "rollout"}, None, 401, "authorization"),
    ("post", "/v1/jobs/a/acquire", {"phase": "rollout"}, "wrong", 404, "job_id"),
    ("post", "/v1/jobs/a/acquire", {"phase": "rollout"}, "tökén", 404, "job_id"),
    ("post", "/v1/jobs/a/acquire", {"phase": "train"}, "job", 409, "phase"),
    ("post", "/v1/jobs/a/acquire", {"phase": "decode"}, "job", 422, "phase"),
    ("post", "/v1/jobs/a/acquire", {"phase": "rollout", "wait_s": 1e9}, "job", 422, "wait_s"),
    ("post", "/v1/jobs/a/release", {"phase": "train", "grant_seq": 2, "duration_s": 0.1}, "job", 409, "phase"),
    ("post", "/v1/jobs/a/release", {"phase": "rollout", "grant_seq": 99, "duration_s": 0.1}, "job", 409,
     "grant_seq"),
    ("post", "/v1/jobs/a/release", {"phase": "rollout", "grant_seq": 2, "duration_s": -1}, "job", 422,
     "duration_s"),
    ("post", "/v1/jobs/a/release", {"phase": "rollout", "grant_seq": 10**30, "duration_s": 1}, "job", 422,
     "grant_seq"),
    ("post", "/v1/jobs/a/release", {"phase": "rollout", "grant_seq": True, "duration_s": 1}, "job", 422,
     "grant_seq"),
    ("post", "/v1/jobs/a/progress", {"fraction": 1.5}, "job", 422, "fraction"),
    ("post", "/v1/jobs/a/moved", {"ok": "yes"}, "job", 422, "ok"),
    ("post", "/v1/jobs/a/moved", {"ok": 1}, "job", 422, "ok"),
    ("post", "/v1/jobs/a/cancel", None, "wrong", 404, "job_id"),
    ("post", "/v1/jobs/a/complete", None, "tenant", 404, "job_id"),
    ("post", "/v1/jobs/nope/acquire", {"phase": "rollout"}, "job", 404, "job_id"),
    ("post", "/v1/jobs/nope/acquire", {"phase": "rollout"}, "admin", 404, "job_id"),
    ("get", "/v1/nowhere", None, "admin", 404, "path"),
    ("delete", "/v1/jobs/a", None, "admin", 405, "path"),
]


@pytest.mark.parametrize("method,path,body,token,status,field", HOSTILE,
                         ids=[f"{m} {p[:40]} {status}" for m, p, _b, _t, status, _f in HOSTILE])
def test_hostile_request_is_refused_naming_the_field_and_changes_nothing(api, method, path, body, token, status,
                                                                         field):
    client, service, job_token = api
    before = _persisted(client, service)
    headers = _auth({"admin": ADMIN, "job": job_token, "tenant": TENANT}.get(token, token)) if token else {}
    if isinstance(body, bytes):
        r = client.request(method.upper(), path, content=body, headers={**headers, "content-type": "application/json"})
    else:
        r = client.request(method.upper(), path, json=body, headers=headers)
    _assert_problem(r, status, field)
    assert _persisted(client, service) == before


def test_release_with_the_right_grant_but_the_wrong_phase_is_refused_also_after_a_release(api):
    client, service, token = api
    grant = client.post("/v1/jobs/a/acquire", json={"phase": "rollout"}, headers=_auth(token)).json()["grant"]
    ok = client.post("/v1/jobs/a/release", json={"phase": "rollout", "grant_seq": grant["seq"], "duration_s": 0.1},
                     headers=_auth(token))
    assert ok.status_code == 200
    before = _persisted(client, service)
    r = client.post("/v1/jobs/a/release", json={"phase": "train", "grant_seq": grant["seq"], "duration_s": 0.1},
                    headers=_auth(token))
    _assert_problem(r, 409, "grant_seq")  # not taken for a repeat of the rollout release
    again = client.post("/v1/jobs/a/release", json={"phase": "rollout", "grant_seq": grant["seq"],
                                                    "duration_s": 0.1}, headers=_auth(token))
    assert again.status_code == 200, "the same release repeated is answered"
    assert _persisted(client, service) == before


def test_unknown_and_forbidden_look_the_same(api):
    client, _service, token = api
    client.post("/v1/jobs", json={"spec": _spec("b")}, headers=_auth(ADMIN))
    known = client.post("/v1/jobs/b/cancel", headers=_auth(token))
    unknown = client.post("/v1/jobs/zz/cancel", headers=_auth(token))
    assert known.status_code == unknown.status_code == 404
    assert known.json()["reason"].replace("'b'", "ID") == unknown.json()["reason"].replace("'zz'", "ID")


def test_no_answer_carries_a_token_the_caller_did_not_have(api):
    client, service, _token = api
    secret = "s" * 40
    body = {"spec": _spec("b"), "request_id": "r1", "token": secret}
    first = client.post("/v1/jobs", json=body, headers=_auth(ADMIN))
    again = client.post("/v1/jobs", json=body, headers=_auth(ADMIN))
    assert first.status_code == again.status_code == 201
    assert first.json()["token"] is None and again.json()["token"] is None
    assert again.json()["placement"] == first.json()["placement"]
    stolen = client.post("/v1/jobs", json={**body, "token": "t" * 40}, headers=_auth(ADMIN))
    _assert_problem(stolen, 409, "job_id")
    paths = [r.path for r in client.app.routes]
    assert not any("token" in p for p in paths)
    raw = service.store.dump() + (Path(service.store.path).read_bytes().decode("latin-1"))
    assert secret not in raw and ADMIN not in raw, "tokens are stored hashed"


def test_a_tenant_submits_and_its_jobs_carry_its_name(api):
    client, _service, _token = api
    r = client.post("/v1/jobs", json={"spec": _spec("t1")}, headers=_auth(TENANT))
    assert r.status_code == 201 and r.json()["tenant"] == "team-a" and r.json()["token"]
    listed = client.get("/v1/jobs?tenant=team-a", headers=_auth(ADMIN)).json()
    assert [j["job_id"] for j in listed] == ["t1"]
    assert [j["job_id"] for j in client.get("/v1/jobs?state=placed", headers=_auth(ADMIN)).json()] == ["a", "t1"]


def test_a_finished_jobs_id_can_be_submitted_again(api):
    client, _service, token = api
    assert client.post("/v1/jobs/a/complete", headers=_auth(token)).json()["state"] == "done"
    again = client.post("/v1/jobs", json={"spec": _spec("a")}, headers=_auth(ADMIN))
    assert again.status_code == 201 and again.json()["state"] == "placed"
    old = client.get("/v1/jobs/a", headers=_auth(token))  # the old run's token reads the old run, not the new
    assert old.status_code == 200 and old.json()["state"] == "done", old.text
    ended = client.post("/v1/jobs/a/heartbeat", json={}, headers=_auth(token))  # its own run's end, not the new run
    assert ended.status_code == 410 and ended.json()["state"] == "done", ended.text


def test_the_live_job_limit_counts_a_reused_id_and_spares_only_a_retry(tmp_path):
    service = Service(_cluster(None), str(tmp_path / "state.db"), ADMIN, _config(max_live_jobs=2))
    with TestClient(create_app(service)) as client:
        def submit(job_id: str, **extra):
            return client.post("/v1/jobs", json={"spec": _spec(job_id), **extra}, headers=_auth(ADMIN))

        old = submit("old")
        assert old.status_code == 201
        assert client.post("/v1/jobs/old/cancel", headers=_auth(ADMIN)).status_code == 200
        first = submit("live1", request_id="r-1", token="t" * 32)
        assert first.status_code == 201 and submit("live2").status_code == 201
        before = _persisted(client, service)
        _assert_problem(submit("new"), 429, "spec")
        _assert_problem(submit("old"), 429, "spec")  # a departed job's id is a new job
        _assert_problem(submit("live2"), 409, "job_id")  # a live one's is a duplicate, limit or not
        assert _persisted(client, service) == before
        retry = submit("live1", request_id="r-1", token="t" * 32)  # a lost answer, asked again
        assert retry.status_code == 201 and retry.json()["job_id"] == "live1"
        assert _persisted(client, service) == before


def test_a_tenant_quota_bounds_its_live_jobs_and_the_gpus_they_ask_for(tmp_path):
    quotas = {"team-a": Quota(max_live_jobs=2, max_gpus=40)}
    service = Service(_cluster(None), str(tmp_path / "state.db"), ADMIN, _config(quotas=quotas))
    with TestClient(create_app(service)) as client:
        def submit(job_id: str, token: str = TENANT, gpus: int = 8, **extra):
            spec = _spec(job_id, rollout_gpus=gpus, train_gpus=gpus)
            return client.post("/v1/jobs", json={"spec": spec, **extra}, headers=_auth(token))

        assert submit("a1", request_id="r-1", token=TENANT).status_code == 201
        assert submit("a2").status_code == 201
        assert submit("admin-job", token=ADMIN, gpus=64).status_code == 201  # the admin has no quota
        before = _persisted(client, service)
        refused = submit("a3")
        _assert_problem(refused, 429, "tenant")
        assert "max_live_jobs" in refused.json()["reason"]
        assert _persisted(client, service) == before
        usage = client.get("/v1/status", headers=_auth(ADMIN)).json()["tenants"]
        assert usage == {"team-a": {"live_jobs": 2, "gpus": 32, "max_live_jobs": 2, "max_gpus": 40}}
        metrics = client.get("/metrics").text
        for line in ('rollmux_tenant_live_jobs{tenant="team-a"} 2.0', 'rollmux_tenant_gpus{tenant="team-a"} 32.0',
                     'rollmux_tenant_quota{bound="max_live_jobs",tenant="team-a"} 2.0',
                     'rollmux_tenant_quota{bound="max_gpus",tenant="team-a"} 40.0'):
            assert line in metrics, line
        assert client.post("/v1/jobs/a1/cancel", headers=_auth(ADMIN)).status_code == 200
        wide = submit("a3", gpus=16)  # 16 held + 32 asked > 40
        _assert_problem(wide, 429, "tenant")
        assert "max_gpus 40" in wide.json()["reason"]
        assert submit("a3", gpus=8).status_code == 201  # 16 + 16 <= 40
        retried = client.post("/v1/jobs", json={"spec": _spec("a3", rollout_gpus=8, train_gpus=8)},
                              headers=_auth(TENANT))
        _assert_problem(retried, 409, "job_id")  # a live id is a duplicate, quota or not


def test_a_retried_submit_of_a_run_gone_from_memory_gets_its_first_answer(tmp_path):
    """With ``--keep-ended 1`` a departed run leaves memory; its submit retried (same
    request id and token) is answered from the state file, not started again. The same
    request id and token with another spec is refused (409 ``request_id``), in memory or
    not."""
    service = Service(_cluster(None), str(tmp_path / "state.db"), ADMIN, _config(keep_ended=1))
    with TestClient(create_app(service)) as client:
        def submit(job_id: str):
            return client.post("/v1/jobs", json={"spec": _spec(job_id), "request_id": f"r-{job_id}",
                                                 "token": job_id * 16}, headers=_auth(ADMIN))

        for job_id in ("k1", "k2", "k3"):
            assert submit(job_id).status_code == 201
            assert client.post(f"/v1/jobs/{job_id}/cancel", headers=_auth(ADMIN)).status_code == 200
        assert "k1" not in service.control.jobs
        before = _persisted(client, service)
        again = submit("k1")
        assert again.status_code == 201 and again.json()["state"] == "cancelled", again.text
        assert _persisted(client, service) == before and "k1" not in service.control.jobs
        for job_id in ("k1", "k3"):  # gone from memory, and still in it: the same request, another spec
            other = client.post("/v1/jobs", json={"spec": _spec(job_id, iterations=9), "request_id": f"r-{job_id}",
                                                  "token": job_id * 16}, headers=_auth(ADMIN))
            _assert_problem(other, 409, "request_id")
        assert _persisted(client, service) == before


def test_a_retried_submit_whose_id_another_run_took_since_gets_its_first_answer(tmp_path):
    """(an auditor's case) team-b's run of ``shared1`` departs, team-a submits ``shared1``
    again, then team-b's first submit is retried (a lost answer): it got 409 ``already
    registered``, and team-b's job token 404 on its own run. It now gets its first answer
    (the departed run), nothing changed, and its token reads its own run."""
    team_b = "tenant-b-secret-token"
    config = _config(tenants={"team-a": hash_token(TENANT), "team-b": hash_token(team_b)})
    service = Service(_cluster(None), str(tmp_path / "state.db"), ADMIN, config)
    mine = "m" * 32
    with TestClient(create_app(service)) as client:
        first = {"spec": _spec("shared1"), "request_id": "req-b-1", "token": mine}
        assert client.post("/v1/jobs", json=first, headers=_auth(team_b)).status_code == 201
        assert client.post("/v1/jobs/shared1/cancel", headers=_auth(ADMIN)).status_code == 200
        taken = client.post("/v1/jobs", json={"spec": _spec("shared1"), "token": "a" * 32}, headers=_auth(TENANT))
        assert taken.status_code == 201 and taken.json()["state"] != "cancelled"
        before = _persisted(client, service)
        again = client.post("/v1/jobs", json=first, headers=_auth(team_b))
        assert again.status_code == 201 and again.json()["state"] == "cancelled", again.text
        assert _persisted(client, service) == before
        own = client.get("/v1/jobs/shared1", headers=_auth(mine))
        assert own.status_code == 200 and own.json()["state"] == "cancelled", own.text
        theirs = client.get("/v1/jobs/shared1", headers=_auth("a" * 32))
        assert theirs.status_code == 200 and theirs.json()["state"] != "cancelled"
        cancel = client.post("/v1/jobs/shared1/cancel", headers=_auth(mine))  # its own run's cancel, repeated
        assert cancel.status_code == 200 and cancel.json()["state"] == "cancelled", cancel.text
        assert service.control.jobs["shared1"].live and _persisted(client, service) == before  # not team-a's run


def test_limits_hold_under_concurrent_submits(thread_server):
    """Submits that arrive together are counted one after the other (the check runs
    inside the change): with room for 3, exactly 3 of 12 concurrent submits get in, for
    the service's limit and for a tenant's quota alike."""
    for config, token in ((_config(max_live_jobs=3), ADMIN),
                          (_config(quotas={"team-a": Quota(max_live_jobs=3)}), TENANT)):
        service, url = thread_server(config)

        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                return await asyncio.gather(*(http.post("/v1/jobs", json={"spec": _spec(f"c{i}")},
                                                        headers=_auth(token)) for i in range(12)))

        answers = asyncio.run(burst())
        codes = sorted(r.status_code for r in answers)
        assert codes == [201] * 3 + [429] * 9, codes
        assert sum(1 for r in service.control.jobs.values() if r.live) == 3


def test_one_bad_change_in_a_batch_fails_only_its_caller(tmp_path):
    """Changes queued together run as one batch with one commit (``Service.mutate``): a
    spec the cluster cannot take, or a change that fails half-way (a bug), is refused to
    its caller alone, and the batch's other changes are made and committed."""
    from rollmux.runtime.api_models import JobSpec
    from rollmux.runtime.control import SpecRejected

    path = str(tmp_path / "state.db")
    service = Service(_cluster(None), path, ADMIN, _config())

    def submit(job_id: str, **extra):
        job = JobSpec(**_spec(job_id, **extra)).to_job()
        return lambda c, now: c.submit(job, now, hash_token(job_id * 16))

    def half_way(c, now):
        c.submit(JobSpec(**_spec("half")).to_job(), now, hash_token("h" * 16))
        raise RuntimeError("a bug after a change")

    async def batch():
        return await asyncio.gather(*(service.mutate(fn) for fn in (
            submit("b"), submit("x", mem_roll_gb=5000), half_way, submit("d"))), return_exceptions=True)

    b, x, bug, d = asyncio.run(batch())
    assert (b.job_id, d.job_id) == ("b", "d")
    assert isinstance(x, SpecRejected) and x.field == "spec.mem_roll_gb" and x.status == 422
    assert isinstance(bug, RuntimeError)
    assert set(service.control.jobs) == {"b", "d"}
    service.close()
    again = Service(_cluster(None), path, ADMIN, _config())  # what was committed
    assert set(again.control.jobs) == {"b", "d"}
    again.close()


def test_a_chunked_body_is_held_to_the_limit_and_passed_on_whole_below_it(api):
    client, service, _token = api
    before = _persisted(client, service)

    def chunks(body: bytes, size: int = 4096):
        for k in range(0, len(body), size):
            yield body[k:k + size]

    big = json.dumps({"spec": _spec("x", model="m" * 100_000)}).encode()
    r = client.post("/v1/jobs", content=chunks(big), headers={**_auth(ADMIN), "content-type": "application/json"})
    assert "content-length" not in r.request.headers
    _assert_problem(r, 413, "body")
    assert _persisted(client, service) == before
    small = json.dumps({"spec": _spec("c")}).encode()
    r = client.post("/v1/jobs", content=chunks(small, 16), headers={**_auth(ADMIN), "content-type": "application/json"})
    assert r.status_code == 201, r.text


def test_a_retried_release_is_counted_once_in_the_phase_histogram(api):
    client, _service, token = api
    grant = client.post("/v1/jobs/a/acquire", json={"phase": "rollout"}, headers=_auth(token)).json()["grant"]
    body = {"phase": "rollout", "grant_seq": grant["seq"], "duration_s": 0.1}
    for _ in range(3):  # the first release and two retries
        assert client.post("/v1/jobs/a/release", json=body, headers=_auth(token)).status_code == 200
    metrics = client.get("/metrics").text
    assert 'rollmux_phase_duration_seconds_count{pool="rollout"} 1.0' in metrics


def test_unbounded_pool_caps_job_width_before_planning(tmp_path):
    service = Service(_cluster(None), str(tmp_path / "state.db"), ADMIN, _config(max_job_gpus=64))
    with TestClient(create_app(service)) as client:
        before = service.store.dump()
        t0 = time.perf_counter()
        r = client.post("/v1/jobs", json={"spec": _spec("huge", rollout_gpus=24000)}, headers=_auth(ADMIN))
        assert time.perf_counter() - t0 < 5.0
        _assert_problem(r, 422, "spec.rollout_gpus")
        assert "--max-job-gpus" in r.json()["reason"]
        assert service.store.dump() == before
        ok = client.post("/v1/jobs", json={"spec": _spec("wide", rollout_gpus=64, train_gpus=64)},
                         headers=_auth(ADMIN))
        assert ok.status_code == 201 and len(ok.json()["placement"]["rollout_nodes"]) == 8


def test_a_full_disk_fails_the_submit_changes_nothing_and_the_service_carries_on(api):
    client, service, token = api
    db = service.store._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")  # the disk is full
    failed = None
    for i in range(300):
        before = _persisted(client, service)
        r = client.post("/v1/jobs", json={"spec": _spec(f"b{i}", model="m" * 128)}, headers=_auth(ADMIN))
        if r.status_code != 201:
            failed = i
            break
    assert failed is not None, "the file never filled up"
    _assert_problem(r, 503, "state")
    assert "full" in r.json()["reason"]
    assert client.get(f"/v1/jobs/b{failed}", headers=_auth(ADMIN)).status_code == 404, "memory follows the file"
    assert _persisted(client, service) == before
    assert "rollmux_commit_failures_total 1.0" in client.get("/metrics").text
    db.execute("PRAGMA max_page_count = 1073741823")  # space again
    r = client.post("/v1/jobs", json={"spec": _spec(f"b{failed}")}, headers=_auth(ADMIN))
    assert r.status_code == 201
    seqs = [e["seq"] for e in service.store.events()]
    assert seqs == list(range(1, len(seqs) + 1)), "the grant log has no gap"
    grant = client.post("/v1/jobs/a/acquire", json={"phase": "rollout"}, headers=_auth(token)).json()
    assert grant["granted"]


def test_a_second_server_on_the_same_file_refuses_to_start(tmp_path):
    first = Service(_cluster(), str(tmp_path / "state.db"), ADMIN, _config())
    with pytest.raises(StateLocked, match="held by another rollmux process"):
        Service(_cluster(), str(tmp_path / "state.db"), ADMIN, _config())
    env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN)
    proc = subprocess.run([ROLLMUX, "serve", "--state", str(tmp_path / "state.db"), "--port", str(free_port())],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "held by another rollmux process" in proc.stdout + proc.stderr
    first.close()


@pytest.mark.parametrize("taken", ["port", "host"])
def test_a_port_it_cannot_listen_on_is_refused_naming_it_and_writes_nothing(tmp_path, taken):
    """The port is bound before the state file, its lock or the admin token are written:
    a second server started by mistake on a busy port, or a host that is not this
    machine's, leaves the folder as it was."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        where = ["--port", port] if taken == "port" else ["--host", "192.0.2.1", "--port", str(free_port())]
        proc = subprocess.run([ROLLMUX, "serve", "--state", str(tmp_path / "state.db"), *where],
                              capture_output=True, text=True, timeout=60, env=dict(os.environ, PATH="/usr/bin:/bin"))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, said
    assert ("--port " + port + ":" in said and "in use" in said if taken == "port"
            else "--host 192.0.2.1" in said and "cannot listen on 192.0.2.1" in said), said
    assert list(tmp_path.iterdir()) == []  # no state file, lock or admin token


def test_a_damaged_file_refuses_to_start_with_how_to_recover(tmp_path):
    (tmp_path / "state.db").write_bytes(b"")
    env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN)
    proc = subprocess.run([ROLLMUX, "serve", "--state", str(tmp_path / "state.db"), "--port", "1"],
                          capture_output=True, text=True, env=env, timeout=60)
    out = " ".join((proc.stdout + proc.stderr).split())  # (the console wraps long lines)
    assert proc.returncode == 2 and "--state" in out and "empty (0 bytes)" in out and "--new-state" in out
    assert (tmp_path / "state.db").read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]  # no admin token or lock beside it


def test_a_restart_reconciles_the_cluster_file(tmp_path):
    path = str(tmp_path / "state.db")
    service = Service(_cluster(2), path, ADMIN, _config())
    with TestClient(create_app(service)) as client:
        for j in ("a", "b", "c"):
            client.post("/v1/jobs", json={"spec": _spec(j, t=10.0)}, headers=_auth(ADMIN))
        status = client.get("/v1/status", headers=_auth(ADMIN)).json()
    used = {n for g in status["groups"] for n in g["rollout_nodes"]}
    assert used == {"R0", "R1"}
    with pytest.raises(Exception, match="pinned by job"):  # removing a node in use is refused
        Service(_cluster(1), path, ADMIN, _config())
    grown = Cluster(rollout=PoolSpec("H20", 2.5, nodes=4), train=PoolSpec("H800", 5.28, nodes=4),
                    switch_cost=SwitchCost("fixed"))
    service = Service(grown, path, ADMIN, _config())
    assert service.reconciled["added"] == ["R2", "R3", "T2", "T3"]
    assert any("price_per_gpu_hour 1.85 -> 2.5" in c for c in service.reconciled["changed"])
    assert service.control.plan.free_count("rollout") == 2
    service.close()
    kept = Service(None, path, ADMIN, _config())  # no cluster file: the saved one is kept
    assert kept.control.cluster.rollout.nodes == 4 and kept.reconciled is None
    kept.close()


def test_nodes_are_added_drained_and_undrained_live(tmp_path):
    service = Service(_cluster(1), str(tmp_path / "state.db"), ADMIN, _config())
    with TestClient(create_app(service)) as client:
        h = _auth(ADMIN)
        client.post("/v1/jobs", json={"spec": _spec("a", t=10.0)}, headers=h)
        client.post("/v1/jobs", json={"spec": _spec("b", t=10.0)}, headers=h)
        big = client.post("/v1/jobs", json={"spec": _spec("c", t=60.0)}, headers=h).json()
        assert big["state"] == "waiting"
        added = client.post("/v1/admin/nodes", json={"pool": "rollout"}, headers=h).json()
        assert added["node"] == "R1" and added["placed"] == []
        added = client.post("/v1/admin/nodes", json={"pool": "train"}, headers=h).json()
        assert added["node"] == "T1" and added["placed"] == ["c"]
        assert client.post("/v1/admin/nodes/R0/drain", headers=h).json()["jobs_on_node"] == ["a", "b"]
        undrained = client.post("/v1/admin/nodes/R0/undrain", headers=h).json()
        assert undrained["node"] == "R0"
        assert "R0" not in client.get("/v1/status", headers=h).json()["drained"]


def test_a_restart_with_the_cluster_file_it_started_from_keeps_the_nodes_added_live(tmp_path):
    """(the auditor's case: nodes added live were dropped by a restart with the same
    --cluster, or, in use, the restart was refused, telling the operator to drain a node
    they never meant to remove). Once a file names a node it is the file's to remove."""
    path = str(tmp_path / "state.db")
    service = Service(_cluster(1), path, ADMIN, _config())
    with TestClient(create_app(service)) as client:
        h = _auth(ADMIN)
        for pool in ("rollout", "train"):
            client.post("/v1/admin/nodes", json={"pool": pool}, headers=h)
        client.post("/v1/admin/nodes", json={"pool": "rollout"}, headers=h)  # R2: free
        for j in ("a", "b", "c"):
            client.post("/v1/jobs", json={"spec": _spec(j, t=60.0)}, headers=h)
        status = client.get("/v1/status", headers=h).json()
    assert {n for g in status["groups"] for n in g["train_nodes"]} == {"T0", "T1"}  # c on the added nodes
    service.close()
    again = Service(_cluster(1), path, ADMIN, _config())  # the same command line
    assert again.reconciled["kept_live"] == ["R1", "R2", "T1"] and again.reconciled["removed"] == []
    assert (again.control.cluster.rollout.nodes, again.control.cluster.train.nodes) == (3, 2)
    again.close()
    grown = Cluster(rollout=PoolSpec("H20", 1.85, nodes=2), train=PoolSpec("H800", 5.28, nodes=2),
                    switch_cost=SwitchCost("fixed"))
    named = Service(grown, path, ADMIN, _config())  # the file now names R1 and T1; R2 is still live-added
    assert named.reconciled["kept_live"] == ["R2"] and named.control.added_live == {"rollout": {"R2": 2048.0},
                                                                                      "train": {}}
    named.close()
    with pytest.raises(Exception, match="node 'T1' is pinned by job"):  # the file's now: one without it removes it
        Service(_cluster(1), path, ADMIN, _config())


# --- real clocks, real sockets -------------------------------------------------------------

class FakeClocks:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 1000.0
        self.lock = threading.Lock()

    def wall_now(self) -> float:
        return self.wall

    def mono_now(self) -> float:
        with self.lock:
            return self.mono


def test_clock_jumps_neither_expire_live_jobs_nor_keep_dead_ones(tmp_path):
    clocks = FakeClocks()
    service = Service(_cluster(), str(tmp_path / "state.db"), ADMIN, _config(lease_s=5.0, grace_s=1.0),
                      clock=ServiceClock(wall=clocks.wall_now, monotonic=clocks.mono_now))
    with TestClient(create_app(service)) as client:
        h = _auth(ADMIN)
        live = client.post("/v1/jobs", json={"spec": _spec("live")}, headers=h).json()["token"]
        client.post("/v1/jobs", json={"spec": _spec("dead")}, headers=h)
        clocks.wall += 90.0  # the wall clock jumps forward: nothing may expire
        time.sleep(1.0)  # the reaper runs every 0.5 s
        states = {j["job_id"]: j["state"] for j in client.get("/v1/jobs", headers=h).json()}
        assert states == {"live": "placed", "dead": "placed"}
        clocks.wall -= 3600.0  # and back an hour: a silent job must still expire on time
        for _ in range(4):
            with clocks.lock:
                clocks.mono += 2.0
            assert client.post("/v1/jobs/live/heartbeat", json={}, headers=_auth(live)).status_code == 200
            time.sleep(0.7)
        states = {j["job_id"]: j["state"] for j in client.get("/v1/jobs", headers=h).json()}
        assert states == {"live": "placed", "dead": "expired"}
        events = service.store.events()
        assert [e["at"] for e in events] == sorted(e["at"] for e in events), "timestamps never run backwards"
        assert "rollmux_lease_expiries_total 1.0" in client.get("/metrics").text


@pytest.fixture
def thread_server(tmp_path):
    """The service under uvicorn in a thread on a free loopback port."""
    started = []

    def start(config: ServiceConfig, cluster: Cluster | None = None) -> tuple[Service, str]:
        service = Service(cluster or _cluster(None), str(tmp_path / f"state{len(started)}.db"), ADMIN, config)
        port = free_port()
        server = uvicorn.Server(server_config(service, "127.0.0.1", port))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started.append((server, thread))
        return service, f"http://127.0.0.1:{port}"

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(15)


def test_a_heartbeat_is_answered_while_a_slow_submit_is_planned(thread_server):
    service, url = thread_server(_config())
    client = Client(url, ADMIN)
    job = client.submit(_spec("a"), heartbeat=False)
    real = service.control.planner.decide

    def slow(*args, **kw):
        time.sleep(2.0)  # a planner taking 2 s on this submit
        return real(*args, **kw)

    service.control.planner.decide = slow
    slow_done = threading.Event()
    worker = threading.Thread(target=lambda: (client.call("POST", "/jobs", token=ADMIN, json={"spec": _spec("b")}),
                                              slow_done.set()))
    worker.start()
    time.sleep(0.3)
    beats = []
    with httpx.Client(base_url=url, timeout=5) as http:
        for _ in range(10):
            t0 = time.perf_counter()
            r = http.post("/v1/jobs/a/heartbeat", json={}, headers=_auth(job.token))
            beats.append(time.perf_counter() - t0)
            assert r.status_code == 200
    assert not slow_done.is_set(), "the heartbeats were answered while the submit was still being planned"
    worker.join(10)
    assert slow_done.is_set()
    assert max(beats) < 1.0


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that holds every chunk ``delay_s`` seconds in both directions."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self.thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver():
            with contextlib.suppress(ConnectionError):
                while True:
                    at, chunk = await queue.get()
                    await asyncio.sleep(max(0.0, at - self.loop.time()))
                    if chunk is None:
                        break
                    writer.write(chunk)
                    await writer.drain()
            writer.close()

        task = asyncio.create_task(deliver())
        try:
            while chunk := await reader.read(65536):
                queue.put_nowait((self.loop.time() + self.delay_s, chunk))
        except ConnectionError:
            pass
        queue.put_nowait((self.loop.time() + self.delay_s, None))
        await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)

    def close(self) -> None:
        async def shutdown():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def _raw_post(port: int, head_length: int | None, parts: list[tuple[float, bytes]],
              close: bool = False) -> tuple[bytes, float]:
    """POST /v1/jobs over a raw socket: the headers (Content-Length ``head_length``, or
    chunked when None; ``Connection: close`` with ``close``), then each part after its
    pause; returns everything the server sent until it closed the connection, and when."""
    framing = f"Content-Length: {head_length}" if head_length is not None else "Transfer-Encoding: chunked"
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}"
            f"\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        t0 = time.monotonic()
        sock.sendall(head)
        for pause, part in parts:
            time.sleep(pause)
            with contextlib.suppress(OSError):  # the server may have answered and closed already
                sock.sendall(part)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer, time.monotonic() - t0


def test_a_body_not_received_in_time_is_answered_408_and_its_connection_closed(thread_server):
    """Body timeout 1 s: a client that announces 500 bytes and sends 20, or trickles a
    chunked body for longer, gets a 408 naming ``body`` after about 1 s, the server closes
    the connection, nothing is submitted, and the service goes on answering; a body over
    the size limit is answered 413 and its connection closed too; a body that trickles in
    within the time is accepted."""
    service, url = thread_server(_config(body_timeout_s=1.0))
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"spec": _spec("slow")}).encode()
    short, took = _raw_post(port, 500, [(0.0, body[:20])])
    assert short.startswith(b"HTTP/1.1 408"), short[:200]
    assert b'"field":"body"' in short and 0.9 <= took < 10
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[k:k + 8]), body[k:k + 8]) for k in range(0, len(body), 8))
    trickled, took = _raw_post(port, None, [(0.15, chunked[k:k + 16]) for k in range(0, len(chunked), 16)])
    assert trickled.startswith(b"HTTP/1.1 408") and 0.9 <= took < 10, trickled[:200]
    assert "slow" not in service.control.jobs
    assert service.metrics.http_errors.labels("408")._value.get() == 2
    with httpx.Client(base_url=url, timeout=5) as http:
        assert http.get("/healthz").status_code == 200
    too_large, took = _raw_post(port, 70_000, [(0.0, b"x")])  # the client keeps its end open
    assert too_large.startswith(b"HTTP/1.1 413") and took < 3, (too_large[:200], took)
    in_time, _ = _raw_post(port, len(body), [(0.3, body[:30]), (0.3, body[30:])], close=True)
    assert in_time.startswith(b"HTTP/1.1 201"), in_time[:300]
    assert "slow" in service.control.jobs


def _trickle(port: int, first: bytes, drip: bytes, every_s: float, for_s: float) -> tuple[bytes, float, float]:
    """Send ``first``, then one byte of ``drip`` every ``every_s`` seconds for up to
    ``for_s`` seconds, reading whatever the server answers; returns the bytes the server
    sent once ``first``'s answer (if any) is out of the way, when they started coming
    (seconds from the last complete answer, or from the connect), and whether and when
    the server closed (inf if it never did within ``for_s``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.setblocking(False)
        t0 = time.monotonic()
        got, answered_at = b"", t0
        if first:
            sock.sendall(first)
            deadline = time.monotonic() + 10
            while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):  # a whole JSON answer
                assert time.monotonic() < deadline, got
                with contextlib.suppress(BlockingIOError):
                    got += sock.recv(65536)
                time.sleep(0.01)
            answered_at, got = time.monotonic(), b""
        k, closed_at, first_byte_at = 0, math.inf, math.inf
        while time.monotonic() - answered_at < for_s:
            if k < len(drip):
                with contextlib.suppress(OSError):
                    sock.send(drip[k:k + 1])
                k += 1
            end = time.monotonic() + every_s
            while time.monotonic() < end:
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    closed_at = time.monotonic() - answered_at
                    break
                first_byte_at = min(first_byte_at, time.monotonic() - answered_at)
                got += chunk
            if closed_at < math.inf:
                break
        return got, first_byte_at, closed_at


def test_headers_not_received_in_time_are_answered_408_and_an_idle_connection_closed(thread_server):
    """Header timeout 1 s: a client trickling a request's headers a byte every 0.2 s gets
    a 408 naming ``headers`` after about 1 s and its connection is closed, both on a new
    connection and after a first request on a kept-alive one (where every byte cancels
    uvicorn's own keep-alive timer); a connection that sends nothing is closed after
    about 1 s with no answer; a request that takes longer than the deadline to serve is
    answered; the service goes on answering. Plain uvicorn (no deadline) keeps the
    silent connection open, so the deadline is what closes it."""
    service, url = thread_server(_config(header_timeout_s=1.0))
    port = int(url.rsplit(":", 1)[1])
    head = f"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode()
    answer, at, closed = _trickle(port, b"", head, 0.2, 4.0)
    assert answer.startswith(b"HTTP/1.1 408") and b'"field":"headers"' in answer, answer[:300]
    assert 0.9 <= at < 3.0 and closed < 3.5, (at, closed)
    health = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    answer, at, closed = _trickle(port, health, head, 0.2, 4.0)  # the first answer, then the trickle
    assert answer.startswith(b"HTTP/1.1 408") and 0.9 <= at < 3.0 and closed < 3.5, (answer[:200], at, closed)
    answer, at, closed = _trickle(port, b"", b"", 0.2, 4.0)
    assert answer == b"" and 0.9 <= closed < 3.0, (answer[:200], closed)
    assert service.metrics.http_errors.labels("408")._value.get() == 2  # the silent one is no refusal
    real = service.control.planner.decide

    def slow(*args, **kw):
        time.sleep(1.5)  # a submit planned for longer than the header deadline
        return real(*args, **kw)

    service.control.planner.decide = slow
    with httpx.Client(base_url=url, timeout=10) as http:
        submitted = http.post("/v1/jobs", json={"spec": _spec("slow-plan")}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert submitted.status_code == 201, submitted.text
        assert http.get("/healthz").status_code == 200  # the same connection, kept alive


@contextlib.contextmanager
def _serving(config: uvicorn.Config):
    """uvicorn serving ``config`` in a thread, started within 15 s, stopped on exit."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        thread.join(15)


def _answer(port: int, request: bytes) -> bytes:
    """Everything the server sends back to ``request`` on a new connection, until it closes."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                got += chunk
    return got


@pytest.mark.parametrize("base", ["httptools", "h11"])
def test_the_header_deadline_holds_on_both_of_uvicorns_protocols_which_have_none(base):
    """On either HTTP protocol uvicorn may use, with a 1 s deadline: headers trickled on a
    new connection or on a kept-alive one get a 408 and a close after about 1 s, a silent
    connection is closed; the same protocol without the deadline keeps both open (so the
    deadline, not uvicorn, closes them)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from rollmux.runtime.header_deadline import header_deadline_protocol
    from rollmux.runtime.service import problem

    protocol = {"httptools": HttpToolsProtocol, "h11": H11Protocol}[base]
    refusals = []

    async def app(scope, receive, send):  # answers every request with a small JSON document
        if scope["type"] != "http":
            return None
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"),
                                                                            (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    head = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"y" * 40 + b"\r\n\r\n"
    for guarded in (True, False):
        http = header_deadline_protocol(1.0, lambda *a: refusals.append(a), problem, base=protocol) if guarded \
            else protocol
        port = free_port()
        with _serving(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                     http=http, timeout_keep_alive=5)):
            trickled = _trickle(port, b"", head, 0.2, 3.0)
            kept_alive = _trickle(port, b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", head, 0.2, 3.0)
            silent = _trickle(port, b"", b"", 0.2, 2.5)
        if guarded:
            for answer, at, closed in (trickled, kept_alive):
                assert answer.startswith(b"HTTP/1.1 408") and b'"field":"headers"' in answer, answer[:300]
                assert 0.9 <= at < 2.5 and closed < 3.0, (at, closed)
            assert silent[0] == b"" and 0.9 <= silent[2] < 2.5, silent
            assert [(status, field) for status, field, _ in refusals] == [(408, "headers")] * 2
        else:
            assert trickled == kept_alive == silent == (b"", math.inf, math.inf), (trickled, kept_alive, silent)


@pytest.mark.parametrize("base", ["httptools", "h11"])
def test_a_request_uvicorn_cannot_parse_is_counted_and_its_log_line_is_json(base, tmp_path):
    """Bytes that are no HTTP request never reach the app: uvicorn answers 400 itself. On
    either protocol the header-deadline protocol tells ``refused`` of it (a 400 on
    ``request``: metrics and log), and with the service's logging (``logs.setup`` and
    ``server_config``'s ``log_config=None``) uvicorn's own warning is a JSON line too."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from rollmux.runtime import logs
    from rollmux.runtime.header_deadline import header_deadline_protocol

    async def app(scope, receive, send):  # never called with the garbage below
        raise AssertionError(scope)

    refusals = []
    protocol = {"httptools": HttpToolsProtocol, "h11": H11Protocol}[base]
    http = header_deadline_protocol(5.0, lambda *a: refusals.append(a), base=protocol)
    saved = {n: (lg.handlers[:], lg.level, lg.propagate)
             for n in (logs.LOGGER, *logs.SERVER_LOGGERS) for lg in [logging.getLogger(n)]}
    log_file = tmp_path / "service.log"
    logs.setup(log_file)
    port = free_port()
    try:
        with _serving(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", http=http,
                                     log_config=None)):
            answers = [_answer(port, garbage) for garbage in (b"GARBAGE \x01\x02 HTTP/9\r\n\r\n",
                                                              b"POST /v1/jobs HTTP/1.1\r\nContent-Length: abc\r\n\r\n")]
    finally:
        for name, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(name)
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(level)
    assert all(a.startswith(b"HTTP/1.1 400") for a in answers), answers
    assert [(status, field) for status, field, _ in refusals] == [(400, "request")] * 2, refusals
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]  # every line JSON
    server_lines = [line for line in lines if line["event"] == "server"]
    assert len(server_lines) == 2 and all(line["logger"] == "uvicorn.error" and "Invalid HTTP" in line["message"]
                                          for line in server_lines), lines


class StallOnceProxy(DelayProxy):
    """A pass-through proxy whose first connection forwards a request's headers and a few
    bytes of its body, then nothing more from the client (a network that stalls)."""

    def __init__(self, upstream_port: int) -> None:
        self.stalled = 0
        super().__init__(upstream_port, 0.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stalled:
            return await super()._serve(reader, writer)
        self.stalled += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def cut():
            seen = b""
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    if b"\r\n\r\n" not in seen:
                        seen += chunk
                        if b"\r\n\r\n" in seen:
                            up_writer.write(seen[:seen.index(b"\r\n\r\n") + 4 + 5])
                            await up_writer.drain()

        await asyncio.gather(cut(), self._pipe(up_reader, writer), return_exceptions=True)


def test_the_sdk_sends_a_request_again_after_a_408(thread_server):
    service, url = thread_server(_config(body_timeout_s=1.0))
    proxy = StallOnceProxy(int(url.rsplit(":", 1)[1]))
    try:
        client = Client(f"http://127.0.0.1:{proxy.port}", ADMIN, timeout_s=10.0)
        t0 = time.monotonic()
        job = client.submit(_spec("stalled"), heartbeat=False)
        assert time.monotonic() - t0 >= 0.9 and proxy.stalled == 1
        assert job.job_id == "stalled" and "stalled" in service.control.jobs
        assert service.metrics.http_errors.labels("408")._value.get() == 1
    finally:
        proxy.close()


def test_a_slow_network_below_the_grace_never_expires_a_live_job(thread_server):
    """Lease 1 s, grace 2 s, 1 s each way (2 s round trips): the documented rule (round trip
    below grace + 3/4 lease) holds, so the job runs to the end; the same delay with no
    grace loses the lease, which shows the proxy really delays."""
    service, url = thread_server(_config(lease_s=1.0, grace_s=2.0))
    port = int(url.rsplit(":", 1)[1])
    proxy = DelayProxy(port, delay_s=1.0)
    try:
        slow = Client(f"http://127.0.0.1:{proxy.port}", ADMIN, timeout_s=10.0, poll_s=1.0)
        t0 = time.monotonic()
        job = slow.submit(_spec("far", iterations=1, t=0.05))
        assert time.monotonic() - t0 >= 2.0, "the proxy delays"
        for name in ("rollout", "train"):
            with job.phase(name):
                time.sleep(0.05)
        assert job.view["state"] == "done"
        assert service.metrics.expiries._value.get() == 0
    finally:
        proxy.close()

    service, url = thread_server(_config(lease_s=1.0, grace_s=0.0))
    proxy = DelayProxy(int(url.rsplit(":", 1)[1]), delay_s=1.0)
    try:
        job = Client(f"http://127.0.0.1:{proxy.port}", ADMIN, timeout_s=10.0).submit(_spec("far", iterations=1))
        time.sleep(2.5)
        with pytest.raises(LeaseLost):
            with job.phase("rollout"):
                pass
    finally:
        proxy.close()


def test_logs_are_json_lines_with_job_and_group(tmp_path):
    env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN)
    port = free_port()
    log = tmp_path / "service.log"
    proc = subprocess.Popen([ROLLMUX, "serve", "--state", str(tmp_path / "s.db"), "--port", str(port),
                             "--log-file", str(log), "--lease-s", "0.5", "--grace-s", "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, proc.stderr.read1().decode()
                time.sleep(0.1)
        Client(url, ADMIN).submit(_spec("a"), heartbeat=False)
        httpx.post(f"{url}/v1/jobs", json={"spec": _spec("bad", slo=0)}, headers=_auth(ADMIN))
        time.sleep(2.0)  # the job expires
    finally:
        proc.terminate()
        proc.wait(15)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    by_event = {}
    for line in lines:
        by_event.setdefault(line["event"], []).append(line)
    assert {"start", "decision", "admit", "grant", "refused", "expire", "depart"} <= set(by_event)
    assert by_event["grant"][0]["job_id"] == "a" and by_event["grant"][0]["group_id"] == "g0"
    assert by_event["refused"][0]["field"] == "spec.slo" and by_event["refused"][0]["status"] == 422
    assert by_event["expire"][0]["job_id"] == "a"
    assert all("ts" in line and "level" in line for line in lines)


def test_operator_commands_against_a_live_service(thread_server, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rollmux.cli import app

    service, url = thread_server(_config(), cluster=_cluster(2))
    monkeypatch.setenv("ROLLMUX_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("ROLLMUX_URL", url)
    runner = CliRunner()
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "nan.yaml").write_text("job_id: n\nt_roll_s: .nan\nt_train_s: 10\n")
    (tmp_path / "date.yaml").write_text("job_id: d\nt_roll_s: 2026-11-29\nt_train_s: 10\n")
    for name, said in (("empty.yaml", "the job file is empty"), ("list.yaml", "expected a mapping"),
                       ("nan.yaml", "spec.t_roll_s=nan: expected a finite number"),
                       ("date.yaml", "spec.t_roll_s=datetime.date(2026, 11, 29): expected a number")):
        out = runner.invoke(app, ["submit", str(tmp_path / name)])  # (nan and a date were tracebacks)
        assert out.exit_code == 2 and said in " ".join(out.output.split()), out.output
    (tmp_path / "job.yaml").write_text("job_id: cli-job\nt_roll_s: 10\nt_train_s: 10\nslo: 2\n")
    out = runner.invoke(app, ["submit", str(tmp_path / "job.yaml")])
    assert out.exit_code == 0 and "job cli-job: new-group" in out.output and "R[R0]" in out.output
    # the token on one line with its label, however long the id (the console wrapped it at 80 columns)
    (tmp_path / "long.yaml").write_text("job_id: a-rather-long-job-id-of-26\nt_roll_s: 10\nt_train_s: 10\n")
    out = runner.invoke(app, ["submit", str(tmp_path / "long.yaml")])
    line = next(x for x in out.output.splitlines() if "token" in x)
    assert line.startswith("job a-rather-long-job-id-of-26: ") and len(line.split("token ")[1]) >= 40
    assert runner.invoke(app, ["cancel", "a-rather-long-job-id-of-26"]).exit_code == 0
    # an id or node name that would name another job or node in the URL: refused, nothing done
    for args in (["cancel", "nosuch/../cli-job"], ["jobs", "show", "cli-job?x"], ["jobs", "show", ""],
                 ["admin", "nodes", "drain", "R9/../R1"]):
        out = runner.invoke(app, args)
        assert out.exit_code == 2 and "expected 1-128 of A-Z a-z 0-9" in out.output, (args, out.output)
    assert service.control.jobs["cli-job"].live and not service.control.drained
    out = runner.invoke(app, ["jobs", "list", "--state", "placed", "--json"])
    assert [j["job_id"] for j in json.loads(out.output)] == ["cli-job"]
    assert runner.invoke(app, ["jobs", "list", "--state", "running"]).exit_code == 2  # not a state: choices shown
    out = runner.invoke(app, ["jobs", "show", "cli-job"])
    assert json.loads(out.output)["placement"]["rollout_nodes"] == ["R0"]
    out = runner.invoke(app, ["admin", "nodes", "drain", "R0"])
    assert out.exit_code == 0 and "jobs still on it: cli-job" in out.output
    out = runner.invoke(app, ["admin", "nodes", "add", "rollout"])
    assert out.exit_code == 0 and "added R2 to rollout" in out.output
    out = runner.invoke(app, ["admin", "backup", str(tmp_path / "b.db"), "--state", service.store.path])
    assert out.exit_code == 0 and "integrity ok" in out.output
    out = runner.invoke(app, ["status"])
    assert out.exit_code == 0 and "drained: R0" in out.output
    assert "tenants" in out.output and "team-a" in out.output
    monkeypatch.setenv("ROLLMUX_ADMIN_TOKEN", "wrong")
    out = runner.invoke(app, ["jobs", "list"])
    assert out.exit_code == 2 and "403" in out.output
    out = runner.invoke(app, ["admin", "tenant-token", "team-b"])
    token = out.output.split("token: ")[1].split()[0]
    assert hash_token(token) in out.output


@pytest.mark.parametrize("args", [["status"], ["jobs", "list"], ["jobs", "show", "j1"], ["cancel", "j1"],
                                  ["admin", "nodes", "drain", "R0"]])
@pytest.mark.parametrize("status, body", [(200, b"{}"), (200, b'{"groups": [1], "jobs": [{}]}'),
                                          (200, b'[{"job_id": "j1", "state": "placed"}]'),
                                          (400, b"[1,2,3]"), (200, b"<html>proxy page</html>")])
def test_client_commands_exit_2_with_one_error_on_an_answer_that_is_not_rollmuxs(monkeypatch, args, status, body):
    """Another service at --url: a KeyError ('groups', 'state') or an AttributeError was a traceback."""
    from typer.testing import CliRunner

    from rollmux.cli import app

    reply = httpx.Response(status, content=body, headers={"content-type": "application/json"})
    monkeypatch.setattr(Client, "http", lambda self, timeout_s: httpx.Client(
        base_url=self.url, transport=httpx.MockTransport(lambda _request: reply)))
    monkeypatch.setenv("ROLLMUX_ADMIN_TOKEN", ADMIN)
    out = CliRunner().invoke(app, [*args, "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 2 and out.output.startswith("error: "), out.output
    assert "http://127.0.0.1:9" in out.output and "RollMux's" in out.output, out.output


def test_only_the_latest_departed_jobs_stay_in_memory_and_every_run_is_counted(tmp_path):
    """``--keep-ended 2``: /v1/status lists the two latest departed runs; an older run is
    still answered by GET /v1/jobs/ID from the state file and still counted in the jobs
    gauge; a restart rebuilds the same memory and the same counts."""
    path = str(tmp_path / "state.db")
    service = Service(_cluster(None), path, ADMIN, _config(keep_ended=2))

    def listed(client) -> dict[str, str]:
        return {j["job_id"]: j["state"] for j in client.get("/v1/status", headers=_auth(ADMIN)).json()["jobs"]}

    tokens = {}
    with TestClient(create_app(service)) as client:
        for job_id in ("j0", "j1", "j2", "j3", "j0"):  # j0 twice: two runs
            tokens[job_id] = client.post("/v1/jobs", json={"spec": _spec(job_id)}, headers=_auth(ADMIN)).json()["token"]
            assert client.post(f"/v1/jobs/{job_id}/complete", headers=_auth(tokens[job_id])).status_code == 200
        live = client.post("/v1/jobs", json={"spec": _spec("live")}, headers=_auth(ADMIN))
        assert live.status_code == 201
        assert listed(client) == {"j3": "done", "j0": "done", "live": "placed"}
        metrics = client.get("/metrics").text
        assert 'rollmux_jobs{state="done"} 5.0' in metrics and 'rollmux_jobs{state="placed"} 1.0' in metrics
        old = client.get("/v1/jobs/j1", headers=_auth(tokens["j1"]))  # out of memory, from the file
        assert old.status_code == 200 and old.json()["state"] == "done"
        assert client.get("/v1/jobs/j1", headers=_auth(ADMIN)).json()["state"] == "done"
        _assert_problem(client.get("/v1/jobs/j1", headers=_auth(tokens["j2"])), 404, "job_id")
        before = (listed(client), service.control.counts())
    service.close()
    again = Service(_cluster(None), path, ADMIN, _config(keep_ended=2))
    with TestClient(create_app(again)) as client:
        assert (listed(client), again.control.counts()) == before
    again.close()
    everything = Service(_cluster(None), path, ADMIN, _config())  # the default keeps them all
    assert set(everything.control.jobs) == {"j0", "j1", "j2", "j3", "live"}
    assert everything.control.counts() == before[1]
    everything.close()


def _departed_answers(path: str, keep_ended: int) -> tuple[list, bool]:
    """What a service keeping ``keep_ended`` departed runs in memory answers to every call
    about three departed runs (cancelled by the admin, done with its iterations, completed)
    from their own tokens, a stranger's and the admin's: (call, status, state or field)
    each; and whether the runs had left memory. Nothing the answers say changes the state."""
    service = Service(_cluster(None), path, ADMIN, _config(keep_ended=keep_ended))
    tokens = {job_id: job_id[0] * 32 for job_id in ("cancelled", "done", "completed")}
    with TestClient(create_app(service)) as client:
        def post(job_id: str, call: str, token: str, body: dict | None = None) -> httpx.Response:
            return client.post(f"/v1/jobs/{job_id}/{call}", json=body, headers=_auth(token))

        for job_id, token in tokens.items():
            submitted = client.post("/v1/jobs", json={"spec": _spec(job_id, iterations=1), "token": token},
                                    headers=_auth(ADMIN))
            assert submitted.status_code == 201
        assert post("cancelled", "cancel", ADMIN).status_code == 200
        assert post("completed", "complete", tokens["completed"]).status_code == 200
        seqs = {}
        for name in ("rollout", "train"):
            seqs[name] = post("done", "acquire", tokens["done"], {"phase": name}).json()["grant"]["seq"]
            release = {"phase": name, "grant_seq": seqs[name], "duration_s": 0.1}
            assert post("done", "release", tokens["done"], release).status_code == 200
        gone = not any(job_id in service.control.jobs for job_id in tokens)
        before = _persisted(client, service)
        calls = [("heartbeat", {}), ("acquire", {"phase": "rollout"}), ("progress", {"fraction": 0.5}),
                 ("tail", {"fraction": 0.9}), ("moved", {"ok": True}), ("complete", None), ("cancel", None),
                 *(("release", {"phase": name, "grant_seq": seq, "duration_s": 0.1}) for name, seq in seqs.items())]
        answers = []
        for job_id, token in tokens.items():
            for who, bearer in (("own", token), ("admin", ADMIN), ("stranger", tokens["done" if job_id != "done"
                                                                                        else "completed"])):
                for call, body in calls:
                    r = post(job_id, call, bearer, body)
                    answers.append((job_id, who, call, r.status_code, r.json().get("state") or r.json()["field"]))
        assert _persisted(client, service) == before
    service.close()
    return answers, gone


def test_a_departed_run_out_of_memory_is_answered_as_one_in_memory(tmp_path):
    """``--keep-ended 0``: every call about a departed run but GET answered 404 "not found,
    or the token is not this job's", so the SDK raised ``RequestRejected`` where a run still
    in memory got its end (410: ``JobCancelled``, ``LeaseLost``, ``JobDone``) and a lost
    answer's retry of its last release or of ``complete`` was refused. Now a run read from
    the state file is answered exactly as one in memory; a stranger still gets 404."""
    evicted, gone = _departed_answers(str(tmp_path / "keep0.db"), keep_ended=0)
    kept, held = _departed_answers(str(tmp_path / "kept.db"), keep_ended=10_000)
    assert gone and not held
    assert evicted == kept
    mine = {(job_id, call, status, said) for job_id, who, call, status, said in kept if who == "own"}
    assert {("cancelled", "heartbeat", 410, "cancelled"), ("done", "acquire", 410, "done"),
            ("done", "release", 200, "done"), ("done", "release", 410, "done"), ("completed", "complete", 200, "done"),
            ("cancelled", "cancel", 200, "cancelled"), ("completed", "cancel", 410, "done")} <= mine
    assert {(status, said) for _, who, _, status, said in kept if who == "stranger"} == {(404, "job_id")}


def test_the_sdk_gets_a_departed_runs_end_once_the_service_holds_it_in_its_file_only(thread_server):
    """``--keep-ended 0``: the retry of a last release or of ``complete()`` whose answer was
    lost raised ``RequestRejected`` 404, as did a job's next call after an admin's cancel
    (in its phase body, or during its acquire's long poll). Now they get the first answer,
    or ``JobCancelled``."""
    service, url = thread_server(_config(keep_ended=0), _cluster(1))
    admin = Client(url, ADMIN)
    for job_id, path, work in (("last", "release", ("rollout", "train")), ("completes", "complete", ())):
        client = Client(url, ADMIN)
        lossy = LoseAnswer(f"/v1/jobs/{job_id}/{path}", nth=len(work) or 1)
        client._http = httpx.Client(base_url=url, transport=lossy)
        job = client.submit(_spec(job_id, iterations=1))
        for name in work:
            with job.phase(name):
                pass
        if not work:
            job.complete()
        assert (lossy.lost, job.view["state"], job_id in service.control.jobs) == (1, "done", False)
    body = admin.submit(_spec("body", iterations=None))
    with pytest.raises(JobCancelled, match="cancelled by the admin"):
        with body.phase("rollout"):
            admin.cancel("body")
    first, second = admin.submit(_spec("first", iterations=None)), admin.submit(_spec("second", iterations=None))
    assert first.placement["rollout_nodes"] == second.placement["rollout_nodes"] == ["R0"]
    with first.phase("rollout"):  # the second's rollout waits for the node: its acquire long-polls
        cancel = threading.Timer(0.5, admin.cancel, ("second",))
        cancel.start()
        t0 = time.monotonic()
        with pytest.raises(JobCancelled):
            second.phase("rollout").__enter__()
        assert time.monotonic() - t0 < 5
        cancel.join()
    first.cancel()
