"""The live service end to end: real processes, real sockets, kill -9 and restart.

The oracles are independent of the service's bookkeeping: node exclusivity is checked
from the grant log and from the clients' own timestamps; the order inside each group
is checked by replaying the logged admit/finish/remove steps through a fresh
``GroupExecutor`` and comparing the grants it makes with the grants the service made.
API-level refusals (bad token, bad input) run in process and compare the persisted
state before and after.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from loopback_server import free_port
from rollmux.execution import GroupExecutor

ADMIN = "admin-secret"
ROLLMUX = str(Path(sys.executable).with_name("rollmux"))
CLUSTER_YAML = "rollout: {nodes: 4}\ntrain: {nodes: 4}\nswitch_cost_s: 0\n"

WORKER = textwrap.dedent("""
    import json, os, signal, sys, time
    from rollmux import Client
    url, spec, out, phase_s, die_in = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    job = Client(url, os.environ["ROLLMUX_ADMIN_TOKEN"], give_up_s=20.0, poll_s=2.0).submit(spec)
    with open(out + ".id", "w") as f:
        json.dump({"job_id": job.job_id, "token": job.token}, f)
    job.wait_placed(timeout_s=20)
    count = 0
    for _ in range(spec["iterations"]):
        for name in ("rollout", "train"):
            with job.phase(name):
                count += 1
                if count == die_in:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(phase_s)
    job.complete()
    with open(out, "w") as f:
        json.dump({"history": job.history, "view": job.view}, f)
""")


class Server:
    """``rollmux serve`` in a subprocess; ``kill()`` is kill -9, ``start()`` resumes the state file."""

    def __init__(self, tmp: Path, lease_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (tmp / "cluster.yaml").write_text(CLUSTER_YAML)
        self.args = [ROLLMUX, "serve", "--cluster", str(tmp / "cluster.yaml"), "--state", str(tmp / "state.db"),
                     "--port", str(self.port), "--lease-s", str(lease_s), "--grace-s", "0.5",
                     "--log-file", str(tmp / "service.log")]
        self.env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=self.env)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"server did not start: {self.proc.stderr.read1().decode() if self.proc else ''}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(5)

    def admin(self, path: str):
        r = httpx.get(f"{self.url}/v1{path}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
        r.raise_for_status()
        return r.json()


@pytest.fixture
def server(tmp_path):
    servers: list[Server] = []

    def make(lease_s: float) -> Server:
        srv = Server(tmp_path, lease_s)
        servers.append(srv)
        srv.start()
        return srv

    yield make
    for srv in servers:
        if srv.proc and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(5)


def _spawn(tmp: Path, url: str, spec: dict, phase_s: float, die_in: int = 0) -> tuple[subprocess.Popen, Path]:
    script = tmp / "worker.py"
    if not script.exists():  # rewriting it while an earlier worker starts could hand that one an empty file
        script.write_text(WORKER)
    out = tmp / f"{spec['job_id']}.json"
    proc = subprocess.Popen([sys.executable, str(script), url, json.dumps(spec), str(out), str(phase_s), str(die_in)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN))
    return proc, out


def _spec(job_id: str, iterations: int, t: float = 0.1) -> dict:
    return {"job_id": job_id, "t_roll_s": t, "t_train_s": t, "slo": 2.0, "iterations": iterations}


def _wait_all(procs, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("a job process did not finish in time")


def _grant_intervals(events: list[dict]) -> list[tuple[str, str, int, float, float]]:
    """(node, job, seq, start, end) of every grant, ended by the job's next finish or remove."""
    open_grants: dict[str, dict] = {}
    out = []
    for e in events:
        if e["kind"] == "grant":
            assert e["job_id"] not in open_grants, f"job {e['job_id']} granted twice at once"
            open_grants[e["job_id"]] = e
        elif e["kind"] in ("finish", "remove") and e["job_id"] in open_grants:
            g = open_grants.pop(e["job_id"])
            out.extend((n, g["job_id"], g["seq"], g["at"], e["at"]) for n in g["nodes"])
    assert not open_grants, f"grants never ended: {sorted(open_grants)}"
    return out


def _assert_exclusive(intervals) -> None:
    by_node = defaultdict(list)
    for node, job, _seq, start, end in intervals:
        by_node[node].append((start, end, job))
    for node, spans in by_node.items():
        spans.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(spans, spans[1:]):
            assert e1 <= s2, f"node {node}: {j1} [{s1}, {e1}] overlaps {j2} [{s2}, {e2}]"


def _replay(events: list[dict]) -> None:
    """Feed the logged steps of each group to a fresh GroupExecutor; its grants must be the logged ones."""
    by_group = defaultdict(list)
    for e in events:
        by_group[e["group_id"]].append(e)
    for gid, evs in by_group.items():
        ex = GroupExecutor()
        expected, produced = [], []
        pending_at = None
        for e in evs:
            if e["kind"] == "grant":
                expected.append((e["job_id"], e["pool"], tuple(e["nodes"]), e["at"]))
                if pending_at is not None:
                    produced.extend((g.job_id, g.pool, g.nodes, g.start) for g in ex.dispatch(pending_at))
                    pending_at = None
                continue
            if e["kind"] == "admit":
                d = e["detail"]
                ex.admit(e["job_id"], tuple(d["rollout_nodes"]), tuple(d["train_nodes"]), e["at"], *d["switch"])
            elif e["kind"] == "finish":
                ex.finish(e["job_id"], e["at"], requeue=e["detail"]["requeue"])
            elif e["kind"] == "remove":
                ex.remove(e["job_id"])
            pending_at = e["at"]
        if pending_at is not None:
            produced.extend((g.job_id, g.pool, g.nodes, g.start) for g in ex.dispatch(pending_at))
        assert produced == expected, f"group {gid}: replayed grants differ from the service's"


def test_three_jobs_survive_kill_and_restart(server, tmp_path):
    srv = server(lease_s=5.0)
    iterations = 6
    specs = [_spec("a", iterations), _spec("b", iterations), _spec("c", iterations, t=0.06)]
    workers = [_spawn(tmp_path, srv.url, s, phase_s=s["t_roll_s"]) for s in specs]
    deadline = time.monotonic() + 20
    while sum(e["kind"] == "grant" for e in srv.admin("/events")) < 8:
        assert time.monotonic() < deadline, "no progress before the kill"
        time.sleep(0.05)
    srv.kill()
    time.sleep(0.3)
    srv.start()
    assert httpx.get(f"{srv.url}/healthz").json()["restored"] is True
    _wait_all([p for p, _ in workers], timeout_s=40)
    for proc, _ in workers:
        assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]

    status = srv.admin("/status")
    assert {j["job_id"]: (j["state"], j["iterations_done"]) for j in status["jobs"]} == \
        {s["job_id"]: ("done", iterations) for s in specs}
    assert status["groups"] == []
    events = srv.admin("/events")
    admits = [e["group_id"] for e in events if e["kind"] == "admit"]
    assert max(admits.count(g) for g in admits) >= 2, "no group was shared: nothing to multiplex"
    grants = [e for e in events if e["kind"] == "grant"]
    for s in specs:
        pools = [g["pool"] for g in grants if g["job_id"] == s["job_id"]]
        assert pools == ["rollout", "train"] * iterations, f"{s['job_id']}: lost or duplicated phases"
    _assert_exclusive(_grant_intervals(events))
    _replay(events)

    client_spans, seqs = [], []
    for _, out in workers:
        history = json.loads(out.read_text())["history"]
        assert [h[0] for h in history] == ["rollout", "train"] * iterations
        seqs.extend(h[2] for h in history)
        client_spans.extend((n, out.stem, seq, start, end) for _pool, nodes, seq, start, end in history
                            for n in nodes)
    assert sorted(seqs) == sorted(g["seq"] for g in grants), "clients' grants differ from the service's log"
    _assert_exclusive(client_spans)


def test_job_killed_mid_phase_loses_lease_and_others_continue(server, tmp_path):
    srv = server(lease_s=1.0)
    victim, victim_out = _spawn(tmp_path, srv.url, _spec("victim", 50), phase_s=0.05, die_in=3)
    survivor, survivor_out = _spawn(tmp_path, srv.url, _spec("survivor", 8), phase_s=0.05)
    _wait_all([victim, survivor], timeout_s=30)
    assert victim.returncode == -signal.SIGKILL
    assert survivor.returncode == 0, survivor.stderr.read().decode()[-2000:]
    jobs = {j["job_id"]: j for j in srv.admin("/status")["jobs"]}
    assert jobs["victim"]["state"] == "expired"
    assert jobs["survivor"]["state"] == "done" and jobs["survivor"]["iterations_done"] == 8
    events = srv.admin("/events")
    victim_grants = [e for e in events if e["kind"] == "grant" and e["job_id"] == "victim"]
    removed = [e for e in events if e["kind"] == "remove" and e["job_id"] == "victim"]
    assert len(removed) == 1 and removed[0]["at"] > victim_grants[-1]["at"]
    _assert_exclusive(_grant_intervals(events))
    _replay(events)
