"""Live control plane under load: grant latency by client count, commit cost by state size,
and event-loop lag while the largest allowed job is planned. One run, three tables.

Usage: python benchmarks/control_plane.py [--quick] [--clients 10 50 200 500] [--run-s 25]
       [--phase-s 0.02] [--commit-jobs 10 200 1000] [--loop-jobs 1000] [--json OUT]

Every figure is measured in this run and put next to a baseline measured in the same run
(the "x" columns): part 1 against the in-process cost of one change (part 2 at its
smallest state), part 2 against its smallest state, part 3 against the idle heartbeat.
The targets and PASS/MISS are printed beside each table. The machine this was written
for is a shared 2-core box: the service, its client driver and anything else running
compete for the same two cores, so absolute numbers are pessimistic and noisy; the
ratios are the point.

1. Grant latency. Service: ``rollmux serve`` in a subprocess on 127.0.0.1, an unbounded
   cluster with ``switch_cost_s: 0``, a fresh state file for every client count (so every
   change pays its SQLite commit), ``--lease-s 10`` (grace 10 s, the default), the JSON
   log to a file, ``--max-live-jobs`` above the client count. Clients: one job each,
   rollout/train iterations whose bodies sleep ``--phase-s``, for ``--run-s`` seconds (at
   most ``--iterations`` iterations), then ``complete``. Each client heartbeats every
   lease/4 on its own timer, exactly as the SDK does. Grant latency of one phase entry =
   (time the client holds the grant) - max(time the service made the grant, time the
   client asked): the long-poll wake-up when the client was already waiting, the request
   round trip when the grant was already there (the table gives the p50 of each kind,
   "woken" and "ready"); the wait for a group partner's phase is not in it. The client reads the service's clock as its own monotonic clock plus an
   offset calibrated against ``/v1/status`` (the sample with the smallest round trip; the
   error is at most half of it, well under 1 ms), so wall-clock slewing does not leak in.

   Client driver: not the SDK's threads (500 jobs = 500 phase threads + 500 heartbeat
   threads + their beat threads in one process would measure the GIL of the client, not
   the service), but asyncio + aiohttp speaking the same HTTP API (submit with the admin
   token and a job token chosen by the client, long-poll acquire with ``wait_s`` 5,
   release with the grant's seq, heartbeat, complete), spread over several processes
   (``--client-procs``, default 1 up to 50 clients, else 2), started together after every
   job is submitted. Phases/s counts released phases over the window from the first ask
   to the last release. Lease expiries: ``rollmux_lease_expiries_total`` from /metrics
   and the jobs in state "expired" in /v1/status, read before the service stops.

2. Commit latency, in process (no HTTP): a ``ControlPlane`` with N live jobs (unbounded
   pools, jobs packed as the planner decides), a ``Store`` on a temp file, the initial
   state committed; then many times one typical change: a job releases its phase
   (``ControlPlane.release``, which ends it and dispatches the group's next grant),
   ``take_changes`` and ``Store.commit``. p50/p99 of the commit alone and of the whole
   change; the ratio of the largest N to the smallest (target: within 2x, since a commit
   writes only what changed).

3. Event-loop lag. Service as in 1 but ``--lease-s 600`` (the filler jobs then need no
   heartbeats) holding ``--loop-jobs`` small jobs submitted by the admin. A probe thread
   sends heartbeats for one live job back to back; first alone (idle), then while the
   admin submits, one after another, ``--heavy-submits`` jobs with the largest allowed
   size (``--max-job-gpus`` rollout and train GPUs). Reported: how long each submit
   took, the probe's latency over the heartbeats that overlapped a submit (worst, p99)
   next to idle, and the service's own ``rollmux_event_loop_lag_max_seconds``. Target: a
   heavy submit delays a heartbeat by at most a few ms (worst during - idle p50 <= 5 ms).

Every loop is bounded in count and time; the default run takes a few minutes, ``--quick``
well under one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from rollmux.cluster_file import cluster_from_dict
from rollmux.model import Job
from rollmux.runtime.control import ControlPlane
from rollmux.runtime.store import Store

ADMIN = "bench-admin-token"
LEASE_S = 10.0
POLL_S = 5.0
TARGET_EXPIRY_CLIENTS = 200
TARGET_COMMIT_RATIO = 2.0
TARGET_HEARTBEAT_DELAY_MS = 5.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# --- the service ---------------------------------------------------------------------------
class Served:
    """``rollmux serve`` in a subprocess on a free loopback port, with a fresh state file."""

    def __init__(self, tmp: Path, lease_s: float, max_live_jobs: int, max_job_gpus: int = 256) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (tmp / "cluster.yaml").write_text("switch_cost_s: 0\n")
        self.log = tmp / "service.log"
        env = {**os.environ, "ROLLMUX_ADMIN_TOKEN": ADMIN}
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("rollmux")), "serve", "--cluster", str(tmp / "cluster.yaml"),
             "--state", str(tmp / "state.db"), "--port", str(self.port), "--lease-s", str(lease_s),
             "--max-live-jobs", str(max_live_jobs), "--max-job-gpus", str(max_job_gpus),
             "--log-file", str(self.log)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin = httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {ADMIN}"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rollmux serve exited with {self.proc.returncode}")
            try:
                self.admin.get("/healthz", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("rollmux serve did not start within 30 s")

    def clock_offset(self, samples: int = 30) -> float:
        """Service clock minus this machine's monotonic clock, from the fastest /v1/status round trip."""
        best = (math.inf, 0.0)
        for _ in range(samples):
            t0 = time.monotonic()
            now = self.admin.get("/v1/status").json()["now"]
            t1 = time.monotonic()
            best = min(best, (t1 - t0, now - (t0 + t1) / 2))
        return best[1]

    def metric(self, name: str) -> float:
        text = self.admin.get("/metrics").text
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else float("nan")

    def expired_jobs(self) -> int:
        return sum(1 for j in self.admin.get("/v1/status").json()["jobs"] if j["state"] == "expired")

    def stop(self) -> None:
        self.admin.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- part 1: the client driver (one process of asyncio clients) ------------------------------------
def _driver(url: str, ids: list[str], phase_s: float, run_s: float, max_iterations: int, offset: float,
            ready: mp.Queue, go: mp.Event, results: mp.Queue) -> None:
    try:
        results.put(asyncio.run(_drive(url, ids, phase_s, run_s, max_iterations, offset, ready, go)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        ready.put(("error", repr(exc)))
        results.put({"error": repr(exc)})


async def _drive(url: str, ids: list[str], phase_s: float, run_s: float, max_iterations: int, offset: float,
                 ready: mp.Queue, go: mp.Event) -> dict:
    import aiohttp

    out = {"latencies": [], "woken": [], "ready": [], "phases": 0, "first_ask": math.inf, "last_release": -math.inf, "errors": [],
           "beats": 0, "beat_failures": 0}
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=POLL_S + 30)
    async with aiohttp.ClientSession(url, connector=conn, timeout=timeout) as http:
        async def call(path: str, token: str, body: dict | None = None) -> dict:
            async with http.post("/v1" + path, json=body if body is not None else {},
                                 headers={"Authorization": f"Bearer {token}"}) as r:
                data = await r.json(content_type=None)
                if r.status >= 400:
                    raise RuntimeError(f"{path}: HTTP {r.status}: {data.get('detail', data)}")
                return data

        tokens: dict[str, str] = {}
        sem = asyncio.Semaphore(8)

        async def submit(job_id: str) -> None:
            tok = secrets.token_urlsafe(32)
            async with sem:
                await call("/jobs", ADMIN, {"spec": {"job_id": job_id, "t_roll_s": phase_s, "t_train_s": phase_s,
                                                     "slo": 2.0}, "request_id": job_id, "token": tok})
            tokens[job_id] = tok

        await asyncio.gather(*(submit(j) for j in ids))
        stop = asyncio.Event()
        done: set[str] = set()  # jobs that completed: their heartbeats stop, as the SDK's do

        async def heartbeat(job_id: str) -> None:
            period, next_at = LEASE_S / 4, time.monotonic() + LEASE_S / 4
            while not stop.is_set() and time.monotonic() < deadline + 60:
                with _suppress_timeout():
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
                if stop.is_set() or job_id in done:
                    return
                next_at += period
                try:
                    await call(f"/jobs/{job_id}/heartbeat", tokens[job_id])
                    out["beats"] += 1
                except Exception:  # noqa: BLE001 - counted
                    out["beat_failures"] += 1

        deadline = time.monotonic() + 3600  # replaced once started
        beats = [asyncio.create_task(heartbeat(j)) for j in ids]
        ready.put(("ready", len(ids)))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, go.wait, 120)
        deadline = time.monotonic() + run_s

        async def client(job_id: str) -> None:
            tok = tokens[job_id]
            try:
                for _ in range(max_iterations):
                    if time.monotonic() >= deadline:
                        break
                    for phase in ("rollout", "train"):
                        asked = time.monotonic()
                        out["first_ask"] = min(out["first_ask"], asked)
                        for _poll in range(int((run_s + 60) / POLL_S) + 1):
                            ans = await call(f"/jobs/{job_id}/acquire", tok, {"phase": phase, "wait_s": POLL_S})
                            if ans["granted"]:
                                break
                        else:
                            raise RuntimeError(f"{job_id}: no {phase} grant within {run_s + 60:g}s")
                        held = time.monotonic()
                        grant = ans["grant"]
                        lat = held + offset - max(grant["granted_at"], asked + offset)
                        out["latencies"].append(lat)
                        out["woken" if grant["granted_at"] > asked + offset else "ready"].append(lat)
                        await asyncio.sleep(phase_s)
                        await call(f"/jobs/{job_id}/release", tok, {"phase": phase, "grant_seq": grant["seq"],
                                                                    "duration_s": time.monotonic() - held})
                        out["phases"] += 1
                        out["last_release"] = max(out["last_release"], time.monotonic())
            except Exception as exc:  # noqa: BLE001 - reported
                out["errors"].append(repr(exc))
            done.add(job_id)
            try:
                await call(f"/jobs/{job_id}/complete", tok)
            except Exception as exc:  # noqa: BLE001 - reported
                out["errors"].append(repr(exc))

        await asyncio.gather(*(client(j) for j in ids))
        stop.set()
        await asyncio.gather(*beats, return_exceptions=True)
    return out


class _suppress_timeout:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return exc_type is asyncio.TimeoutError


def grant_latency(n_clients: int, phase_s: float, run_s: float, max_iterations: int, procs: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        svc = Served(Path(tmp), LEASE_S, max_live_jobs=max(5000, 2 * n_clients))
        try:
            offset = svc.clock_offset()
            ctx = mp.get_context("fork")
            ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
            ids = [f"c{i}" for i in range(n_clients)]
            shares = [ids[k::procs] for k in range(procs)]
            workers = [ctx.Process(target=_driver, args=(svc.url, share, phase_s, run_s, max_iterations, offset,
                                                         ready, go, results), daemon=True)
                       for share in shares if share]
            t_submit = time.monotonic()
            for w in workers:
                w.start()
            for _ in workers:
                kind, what = ready.get(timeout=300)
                if kind == "error":
                    raise RuntimeError(f"client process failed while submitting: {what}")
            submit_s = time.monotonic() - t_submit
            go.set()
            outs = [results.get(timeout=run_s + 180) for _ in workers]
            for w in workers:
                w.join(30)
            failed = [o["error"] for o in outs if "error" in o]
            if failed:
                raise RuntimeError(f"client process failed: {failed[0]}")
            expiries = svc.metric("rollmux_lease_expiries_total")
            expired = svc.expired_jobs()
            loop_lag = svc.metric("rollmux_event_loop_lag_max_seconds")
        finally:
            svc.stop()
    lat = [x for o in outs for x in o["latencies"]]
    woken = [x for o in outs for x in o["woken"]]
    ready_ = [x for o in outs for x in o["ready"]]
    phases = sum(o["phases"] for o in outs)
    window = max(o["last_release"] for o in outs) - min(o["first_ask"] for o in outs)
    errors = [e for o in outs for e in o["errors"]]
    return {"clients": n_clients, "procs": len(workers), "grants": len(lat), "phases": phases,
            "p50_ms": statistics.median(lat) * 1e3 if lat else float("nan"), "p99_ms": _pct(lat, 0.99) * 1e3,
            "woken": len(woken), "woken_p50_ms": _pct(woken, 0.5) * 1e3, "ready": len(ready_),
            "ready_p50_ms": _pct(ready_, 0.5) * 1e3,
            "phases_per_s": phases / window if window > 0 else 0.0, "window_s": window, "submit_s": submit_s,
            "expiries": expiries, "expired_jobs": expired, "beats": sum(o["beats"] for o in outs),
            "beat_failures": sum(o["beat_failures"] for o in outs), "errors": len(errors),
            "first_error": errors[0] if errors else None, "loop_lag_max_ms": loop_lag * 1e3}


# --- part 2: commit latency in process -----------------------------------------------------------
def commit_latency(n_jobs: int, rounds: int) -> dict:
    cp = ControlPlane(cluster_from_dict({"switch_cost_s": 0}))
    now = 1_000_000.0
    for i in range(n_jobs):
        cp.submit(Job(f"j{i}", 10.0, 10.0, slo=2.0), now, "0" * 64)
        now += 0.001
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "state.db")
        store.commit(cp.take_changes())
        ids = list(cp.jobs)
        whole, commit, release = [], [], []
        k = 0
        for _ in range(rounds):
            for _scan in range(len(ids)):  # the next job holding a grant (outside the timing)
                rec = cp.jobs[ids[k % len(ids)]]
                k += 1
                if rec.grant is not None:
                    break
            else:
                raise RuntimeError("no job holds a grant")
            now += 0.05
            g = rec.grant
            t0 = time.perf_counter()
            cp.release(rec.job_id, g.pool, g.seq, now - g.granted_at, now)
            changes = cp.take_changes()
            t1 = time.perf_counter()
            store.commit(changes)
            t2 = time.perf_counter()
            whole.append(t2 - t0)
            commit.append(t2 - t1)
            release.append(t1 - t0)
        store.close()
    return {"jobs": n_jobs, "groups": len(cp.plan.groups), "rounds": rounds,
            "commit_p50_us": statistics.median(commit) * 1e6, "commit_p99_us": _pct(commit, 0.99) * 1e6,
            "change_p50_us": statistics.median(whole) * 1e6, "change_p99_us": _pct(whole, 0.99) * 1e6,
            "release_p50_us": statistics.median(release) * 1e6}


# --- part 3: event-loop lag during a heavy submit --------------------------------------------------
def loop_lag(n_jobs: int, heavy: int, max_job_gpus: int, idle_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        svc = Served(Path(tmp), 600.0, max_live_jobs=n_jobs + heavy + 100, max_job_gpus=max_job_gpus)
        try:
            probe_token = secrets.token_urlsafe(32)
            svc.admin.post("/v1/jobs", json={"spec": {"job_id": "probe", "t_roll_s": 1, "t_train_s": 1},
                                             "token": probe_token}).raise_for_status()
            t0 = time.monotonic()
            for i in range(n_jobs):
                svc.admin.post("/v1/jobs", json={"spec": {"job_id": f"f{i}", "t_roll_s": 10, "t_train_s": 10,
                                                          "slo": 2.0}}).raise_for_status()
            fill_s = time.monotonic() - t0
            groups = len(svc.admin.get("/v1/status").json()["groups"])

            beats: list[tuple[float, float]] = []  # (start, end) on the monotonic clock
            stop = threading.Event()

            def probe() -> None:
                with httpx.Client(base_url=svc.url, timeout=30,
                                  headers={"Authorization": f"Bearer {probe_token}"}) as http:
                    end = time.monotonic() + 300
                    while not stop.is_set() and time.monotonic() < end:
                        a = time.monotonic()
                        http.post("/v1/jobs/probe/heartbeat", json={}).raise_for_status()
                        beats.append((a, time.monotonic()))

            th = threading.Thread(target=probe, daemon=True)
            th.start()
            time.sleep(idle_s)
            idle_end = time.monotonic()
            windows, took = [], []
            for i in range(heavy):
                a = time.monotonic()
                r = svc.admin.post("/v1/jobs", json={"spec": {"job_id": f"heavy{i}", "rollout_gpus": max_job_gpus,
                                                              "train_gpus": max_job_gpus, "t_roll_s": 10,
                                                              "t_train_s": 10, "slo": 2.0}})
                b = time.monotonic()
                r.raise_for_status()
                windows.append((a, b))
                took.append(b - a)
                time.sleep(0.05)
            stop.set()
            th.join(30)
            server_lag = svc.metric("rollmux_event_loop_lag_max_seconds")
        finally:
            svc.stop()
    idle = [e - s for s, e in beats if e <= idle_end]
    during = [e - s for s, e in beats if any(s < b and e > a for a, b in windows)]
    return {"jobs": n_jobs, "groups": groups, "fill_s": fill_s, "heavy_submits": heavy, "gpus": max_job_gpus,
            "submit_p50_ms": statistics.median(took) * 1e3, "submit_max_ms": max(took) * 1e3,
            "idle_beats": len(idle), "idle_p50_ms": statistics.median(idle) * 1e3, "idle_p99_ms": _pct(idle, 0.99) * 1e3,
            "idle_max_ms": max(idle) * 1e3, "during_beats": len(during),
            "during_p50_ms": statistics.median(during) * 1e3 if during else float("nan"),
            "during_p99_ms": _pct(during, 0.99) * 1e3, "during_max_ms": max(during) * 1e3 if during else float("nan"),
            "server_loop_lag_max_ms": server_lag * 1e3}


# --- main ------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Short version: fewer clients, seconds and rounds.")
    parser.add_argument("--clients", type=int, nargs="+", default=None, help="Client counts (default 10 50 200 500).")
    parser.add_argument("--run-s", type=float, default=None, help="Seconds of phases per client count (default 25).")
    parser.add_argument("--iterations", type=int, default=200, help="Most iterations per client.")
    parser.add_argument("--phase-s", type=float, default=0.02)
    parser.add_argument("--client-procs", type=int, default=None, help="Client processes (default 1 up to 50 "
                                                                         "clients, else 2).")
    parser.add_argument("--commit-jobs", type=int, nargs="+", default=None, help="Live jobs (default 10 200 1000).")
    parser.add_argument("--commit-rounds", type=int, default=None, help="Changes measured per size (default 3000).")
    parser.add_argument("--loop-jobs", type=int, default=None, help="Live jobs in part 3 (default 1000).")
    parser.add_argument("--heavy-submits", type=int, default=None, help="Heavy submits in part 3 (default 20).")
    parser.add_argument("--max-job-gpus", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None, help="Write every number to this file.")
    parser.add_argument("--skip", choices=("1", "2", "3"), nargs="*", default=[], help="Parts to leave out.")
    args = parser.parse_args()
    counts = [("--clients", n) for n in args.clients or []] + [("--commit-jobs", n) for n in args.commit_jobs or []]
    counts += [("--client-procs", args.client_procs), ("--commit-rounds", args.commit_rounds),
               ("--loop-jobs", args.loop_jobs), ("--heavy-submits", args.heavy_submits),
               ("--iterations", args.iterations), ("--max-job-gpus", args.max_job_gpus)]
    for option, n in counts:
        if n is not None and n < 1:
            parser.error(f"{option} {n}: expected a whole number >= 1")
    for option, seconds in (("--run-s", args.run_s), ("--phase-s", args.phase_s)):
        if seconds is not None and not seconds > 0:
            parser.error(f"{option} {seconds:g}: expected seconds > 0")
    q = args.quick
    clients = args.clients if args.clients is not None else ([10, 50, 200] if q else [10, 50, 200, 500])
    run_s = args.run_s if args.run_s is not None else (5.0 if q else 25.0)
    commit_jobs = args.commit_jobs if args.commit_jobs is not None else [10, 200, 1000]
    rounds = args.commit_rounds if args.commit_rounds is not None else (500 if q else 3000)
    loop_jobs = args.loop_jobs if args.loop_jobs is not None else (200 if q else 1000)
    heavy = args.heavy_submits if args.heavy_submits is not None else (5 if q else 20)
    report: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "cpus": os.cpu_count()}

    commits = []
    if "2" not in args.skip or "1" not in args.skip:
        commits = [commit_latency(n, rounds) for n in commit_jobs]
        report["commit"] = commits
    base_us = commits[0]["change_p50_us"] if commits else float("nan")

    if "1" not in args.skip:
        rows = []
        print(f"1. grant latency, rollmux serve on loopback (lease {LEASE_S:g}s + grace 10s, phases of "
              f"{args.phase_s:g}s, {run_s:g}s per count; x = p50 over the in-process change at "
              f"{commit_jobs[0]} jobs, {base_us:.0f} us)")
        print(f"{'clients':>7} {'procs':>5} {'grants':>7} {'p50 ms':>8} {'p99 ms':>8} {'x in-proc':>9} "
              f"{'ready p50':>9} {'woken p50':>9} {'phases/s':>9} {'expiries':>8} {'expired':>7} {'errors':>6} "
              f"{'loop lag ms':>11}  target")
        for n in clients:
            procs = args.client_procs if args.client_procs is not None else (1 if n <= 50 else 2)
            r = grant_latency(n, args.phase_s, run_s, args.iterations, procs)
            rows.append(r)
            if n == TARGET_EXPIRY_CLIENTS:
                target = f"0 expiries at {n} clients: {_verdict(r['expiries'] == 0 and r['expired_jobs'] == 0)}"
            else:
                target = "-"
            print(f"{n:>7} {r['procs']:>5} {r['grants']:>7} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                  f"{r['p50_ms'] * 1e3 / base_us:>9.0f} {r['ready_p50_ms']:>9.2f} {r['woken_p50_ms']:>9.2f} "
                  f"{r['phases_per_s']:>9.0f} {r['expiries']:>8.0f} "
                  f"{r['expired_jobs']:>7} {r['errors']:>6} {r['loop_lag_max_ms']:>11.1f}  {target}")
            if r["first_error"]:
                print(f"        first client error: {r['first_error'][:200]}")
        report["grant"] = rows
        print("ready: the grant was made before the client asked (one acquire round trip); woken: the client was "
              "already waiting (long-poll wake-up). loop lag: the service's rollmux_event_loop_lag_max_seconds "
              "(last 10 s) at the end of the run.")
        print()

    if "2" not in args.skip:
        b = commits[0]
        print(f"2. one change (release + take_changes + Store.commit) in process, {rounds} changes per size; "
              f"x = over {b['jobs']} jobs")
        print(f"{'jobs':>5} {'groups':>6} {'commit p50 us':>13} {'p99 us':>8} {'x':>5} {'change p50 us':>13} "
              f"{'p99 us':>8} {'x':>5}  target (x of p50 <= {TARGET_COMMIT_RATIO:g})")
        for r in commits:
            xc, xw = r["commit_p50_us"] / b["commit_p50_us"], r["change_p50_us"] / b["change_p50_us"]
            r["commit_x"], r["change_x"] = xc, xw
            target = "-" if r is b else (f"commit {_verdict(xc <= TARGET_COMMIT_RATIO)}, "
                                         f"change {_verdict(xw <= TARGET_COMMIT_RATIO)}")
            print(f"{r['jobs']:>5} {r['groups']:>6} {r['commit_p50_us']:>13.0f} {r['commit_p99_us']:>8.0f} "
                  f"{xc:>5.2f} {r['change_p50_us']:>13.0f} {r['change_p99_us']:>8.0f} {xw:>5.2f}  {target}")
        print()

    if "3" not in args.skip:
        r = loop_lag(loop_jobs, heavy, args.max_job_gpus, 2.0 if q else 3.0)
        report["loop"] = r
        delay = r["during_max_ms"] - r["idle_p50_ms"]
        print(f"3. heartbeat latency while {r['heavy_submits']} submits of {r['gpus']}+{r['gpus']} GPUs are planned, "
              f"{r['jobs']} live jobs in {r['groups']} groups (filled in {r['fill_s']:.1f}s); x = over idle p50")
        print(f"{'':>22} {'beats':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'x max':>6}")
        print(f"{'idle':>22} {r['idle_beats']:>6} {r['idle_p50_ms']:>8.2f} {r['idle_p99_ms']:>8.2f} "
              f"{r['idle_max_ms']:>8.2f} {r['idle_max_ms'] / r['idle_p50_ms']:>6.1f}")
        print(f"{'during a heavy submit':>22} {r['during_beats']:>6} {r['during_p50_ms']:>8.2f} "
              f"{r['during_p99_ms']:>8.2f} {r['during_max_ms']:>8.2f} {r['during_max_ms'] / r['idle_p50_ms']:>6.1f}")
        print(f"heavy submit took p50 {r['submit_p50_ms']:.1f} ms, max {r['submit_max_ms']:.1f} ms; service "
              f"rollmux_event_loop_lag_max_seconds {r['server_loop_lag_max_ms']:.1f} ms")
        print(f"target: worst heartbeat during a heavy submit - idle p50 <= {TARGET_HEARTBEAT_DELAY_MS:g} ms: "
              f"{delay:.2f} ms {_verdict(delay <= TARGET_HEARTBEAT_DELAY_MS)} (noise floor on this machine: idle "
              f"worst - idle p50 = {r['idle_max_ms'] - r['idle_p50_ms']:.2f} ms; p99 during - idle p50 = "
              f"{r['during_p99_ms'] - r['idle_p50_ms']:.2f} ms)")

    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
