"""Live control plane under a mixed load of job clients and admin readers, optionally
SIGKILLed and restarted mid-run: latency per endpoint and policy, and whether the service
stayed consistent. One run, one table.

Usage: python benchmarks/service_load.py [--policies rollmux rollmux-hedge@locked rollmux-hedge] [--workers 40]
       [--seconds 30] [--kills 0] [--seed 1] [--nodes 12] [--iterations 3,8]
       [--lease-s 10] [--grace-s 5] [--migration-s 0.5] [--readers 2] [--queue backfill|fifo]
       [--fleet H20 H800 H200] [--workdir DIR] [--json OUT]

For each policy of ``--policies`` (the first one is the baseline; default ``rollmux``,
then ``rollmux-hedge``; a name ending in ``@locked`` or ``@apart`` is served with
``--regroup-decisions`` so: ``rollmux-hedge@locked`` decides its regroupings under the
service's lock): ``rollmux serve`` in a subprocess (its own process group) on a
free 127.0.0.1 port, a fresh state file in a temporary folder, the admin token in
``$ROLLMUX_ADMIN_TOKEN``, a bounded cluster of ``--nodes`` rollout + ``--nodes`` train
nodes (``switch_cost_s: 0``), ``--lease-s`` + ``--grace-s``, ``--migration-s`` (0.5 s, so
that moves pass the SLO check and ``rollmux-hedge`` regroups and moves jobs), the JSON log
to a file. Every policy gets the same seeded workload:

* ``--workers`` asyncio clients (httpx, one connection pool) speak the HTTP API
  (docs/serve.md). Each loops over its own jobs: submit with the admin token, a job token
  and a ``request_id`` of its own; long-poll ``acquire`` (``wait_s`` up to 5, never past the
  end of the run), hold the grant 20-150 ms, ``release`` it with its ``grant_seq``; a move
  directive is acknowledged (``moved``, ok) and the phase asked again; an acquire that is
  not granted is followed by a ``heartbeat``. Job specs are drawn per worker from the seed:
  8 or 16 GPUs per side, profiled phases of 2, 5 or 10 s, SLO 1.5, 2 or 3, model 7B, 14B or
  32B, ``--iterations`` a to b iterations. After its first iteration a job cancels itself
  (5%), completes early (5%), or goes silent and must lose its lease (5%); the rest run
  their iterations out.
* ``--readers`` admin readers poll ``/v1/status``, ``/metrics`` and ``/v1/jobs`` every 0.5 s.
* ``--kills K``: the server is SIGKILLed K times at even intervals of the run and restarted
  on the same state file 0.5 s later. Clients retry connection errors and 5xx answers with
  backoff for up to 30 s, with the same request (and so the same request id or grant seq),
  as the SDK does.

After ``--seconds`` the clients stop: each finishes the call it is in, none starts
another (a long poll never outlasts the run). Then every job its client did not end
(still running at the stop, or gone silent) is cancelled by the admin. A cancel that
found the job already expired (410, state ``expired``) is accepted: the lease won the
race (under ``rollmux-hedge`` cancels queue behind regroup planning). Then the checks, all
against the service's own answers (``/v1/jobs``, ``/v1/events``, the log):

* no 5xx answer, no client call given up, no unexpected 4xx;
* every accepted (201) job is present;
* each job's final state is the one its client (or the final cancel) saw, its
  ``iterations_done`` the train phases its client had released, and its ``moved`` events
  the move directives its client acknowledged;
* from ``/v1/events``: no job holds two grants at once, no node is in two overlapping
  grant intervals, no grant is left open once every job has left; ``seq`` runs 1..N
  without gaps or duplicates;
* no ERROR line in the service log.

A client whose job lost its lease while it was still calling is counted ("lease lost
while active"), not failed: on a loaded 2-core box a stalled service can cause it.

The table gives calls and p50/p95/p99/max latency (ms, answered attempts, measured by the
client) per policy and endpoint, with ``x base``: the p50 over the baseline policy's on the
same workload in the same run (``acquire`` is a long poll; its latency is mostly the wait
and gets no ratio; the final cancels and the checks' reads are timed in the JSON only, as
``sweep`` and ``check``). Below it, per policy: jobs, released phases per second, moves and
regroupings (from the events), seconds from each SIGKILL to serving again, and the
consistency line. Exit code 1 when any consistency check fails. The machine this was
written for is a shared 2-core box: the service and the clients compete for the same two
cores, so absolute numbers are pessimistic and noisy; the ratios are the point.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

from rollmux.whatif import nearest_rank

BASELINE = "rollmux"
POLL_S = 5.0  # acquire long-poll wait
GIVE_UP_S = 30.0  # a client retries a call without an answer this long (the SDK's default)
DOWN_S = 0.5  # pause between a SIGKILL and the restart
HOLD_S = (0.02, 0.15)  # how long a client holds a grant
FATES = (("abandon", 0.05), ("cancel", 0.05), ("complete", 0.05))  # after the first iteration; else "run"
ENDPOINTS = ("submit", "acquire", "release", "moved", "heartbeat", "complete", "cancel", "status", "metrics",
             "list")
RATIO_ENDPOINTS = ("release", "submit")  # the ratios printed on their own line


# --- the service ---------------------------------------------------------------------------------
class Served:
    """``rollmux serve`` in a subprocess of its own process group, on a fixed loopback port
    and state file, so that it can be SIGKILLed and restarted where it was."""

    def __init__(self, folder: Path, policy: str, args: argparse.Namespace, admin: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cluster = folder / "cluster.yaml"
        if args.fleet:  # one bounded pool of ``--nodes`` nodes per GPU type, in any role
            pools = "".join(f"  - {{gpu: {gpu}, nodes: {args.nodes}}}\n" for gpu in args.fleet)
            cluster.write_text(f"reference: {{rollout: H20, train: H800}}\npools:\n{pools}switch_cost_s: 0\n")
        else:
            cluster.write_text(f"rollout: {{nodes: {args.nodes}}}\ntrain: {{nodes: {args.nodes}}}\nswitch_cost_s: 0\n")
        self.log = folder / "service.jsonl"
        self.out = folder / "serve.out"
        policy, _, decisions = policy.partition("@")
        self.argv = [str(Path(sys.executable).with_name("rollmux")), "serve", "--cluster", str(cluster),
                     "--state", str(folder / "state.db"), "--host", "127.0.0.1", "--port", str(self.port),
                     "--policy", policy, "--lease-s", str(args.lease_s), "--grace-s", str(args.grace_s),
                     "--migration-s", str(args.migration_s), "--queue", args.queue, "--log-file", str(self.log)]
        if decisions:
            self.argv += ["--regroup-decisions", decisions]
        self.env = {**os.environ, "ROLLMUX_ADMIN_TOKEN": admin, "RAY_AUTH_MODE": "disabled"}
        self.proc: subprocess.Popen | None = None
        self.restored: list[bool] = []  # /healthz "restored" after each start

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rollmux serve exited with {self.proc.returncode}: {self._tail()}")
            try:
                r = httpx.get(self.url + "/healthz", timeout=1)
                if r.status_code == 200:
                    self.restored.append(bool(r.json().get("restored")))
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rollmux serve did not answer within {timeout_s:g}s: {self._tail()}")

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL, as a crash or ``kill -9`` would."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(30)

    def _tail(self) -> str:
        try:
            return self.out.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def log_errors(self) -> list[str]:
        """ERROR lines of the JSON log (a line cut by a SIGKILL is skipped)."""
        bad = []
        if self.log.exists():
            for line in self.log.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if str(entry.get("level", "")).upper() in ("ERROR", "CRITICAL"):
                    bad.append(line[:300])
        return bad


# --- the clients ---------------------------------------------------------------------------------
class Ledger:
    """What the clients saw: latencies, answers, and each accepted job's story."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.codes: Counter = Counter()  # (endpoint, status)
        self.transport: Counter = Counter()  # (endpoint, exception class)
        self.five_xx: list[str] = []
        self.unexpected: list[str] = []  # 4xx a correct client should never get
        self.gave_up: list[str] = []
        self.jobs: dict[str, dict] = {}  # accepted job id -> its story
        self.phases = 0  # releases answered 200 (first answers of each grant)

    def note(self, endpoint: str, r: httpx.Response, seconds: float) -> None:
        self.latency[endpoint].append(seconds)
        self.codes[(endpoint, r.status_code)] += 1
        if r.status_code >= 500:
            self.five_xx.append(f"{endpoint} {r.status_code} {r.text[:200]}")


class Load:
    def __init__(self, http: httpx.AsyncClient, ledger: Ledger, admin: str, args: argparse.Namespace,
                 deadline: float) -> None:
        self.http, self.ledger, self.admin, self.args, self.deadline = http, ledger, admin, args, deadline

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    async def call(self, endpoint: str, method: str, path: str, token: str, body: dict | None = None,
                   timeout_s: float = 30.0) -> httpx.Response | None:
        """One request, retried with backoff on connection errors and 5xx for up to
        ``GIVE_UP_S`` with the same body (every call here is idempotent); None: gave up."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        delay, first_failure = 0.05, None
        while True:
            t0 = time.monotonic()
            try:
                r = await self.http.request(method, path, json=body, headers=headers, timeout=timeout_s)
            except httpx.TransportError as exc:
                self.ledger.transport[(endpoint, type(exc).__name__)] += 1
                r = None
            else:
                self.ledger.note(endpoint, r, time.monotonic() - t0)
                if r.status_code < 500:
                    return r
            now = time.monotonic()
            first_failure = first_failure or now
            if now - first_failure > GIVE_UP_S:
                self.ledger.gave_up.append(f"{endpoint} {path}")
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _odd(self, endpoint: str, job: dict, r: httpx.Response) -> None:
        self.ledger.unexpected.append(f"{endpoint} {job['job_id']}: {r.status_code} {r.text[:200]}")
        job["end"] = "error"

    def _ended(self, job: dict, r: httpx.Response) -> None:
        """A 410: the job left under its client (the problem names its state)."""
        try:
            state = r.json().get("state") or "?"
        except ValueError:
            state = "?"
        job["end"], job["ended_state"] = "ended", state

    async def worker(self, wid: int) -> None:
        rng = random.Random(f"{self.args.seed}-{wid}")
        n = 0
        while not self.over():
            n += 1
            jrng = random.Random(rng.random())  # one per job: the sequence of jobs does not depend on timing
            await self.job(f"w{wid}-{n}", jrng)

    async def job(self, job_id: str, rng: random.Random) -> None:
        lo, hi = self.args.iterations
        spec = {"job_id": job_id, "rollout_gpus": rng.choice((8, 8, 16)), "train_gpus": rng.choice((8, 8, 16)),
                "t_roll_s": rng.choice((2.0, 5.0, 10.0)), "t_train_s": rng.choice((2.0, 5.0, 10.0)),
                "slo": rng.choice((1.5, 2.0, 3.0)), "model": rng.choice(("7B", "14B", "32B")),
                "iterations": rng.randint(lo, hi)}
        x, fate = rng.random(), "run"
        for name, share in FATES:
            if x < share:
                fate = name
                break
            x -= share
        token = secrets.token_urlsafe(32)
        r = await self.call("submit", "POST", "/v1/jobs", self.admin,
                            {"spec": spec, "token": token, "request_id": f"rq-{job_id}"})
        if r is None:
            return
        if r.status_code != 201:
            self.ledger.unexpected.append(f"submit {job_id}: {r.status_code} {r.text[:200]}")
            await asyncio.sleep(0.5)
            return
        job = self.ledger.jobs[job_id] = {"job_id": job_id, "fate": fate, "iterations": 0,
                                          "planned": spec["iterations"], "acked_moves": [], "end": None}
        base = f"/v1/jobs/{job_id}"
        phase = "rollout"
        while True:
            if self.over():
                job["end"] = "stopped"
                return
            if job["iterations"] >= 1 and phase == "rollout" and fate != "run":
                if fate == "abandon":
                    job["end"] = "abandoned"
                    return
                r = await self.call(fate, "POST", f"{base}/{fate}", token)
                if r is None:
                    job["end"] = "gave-up"
                elif r.status_code == 200:
                    job["end"] = "cancelled" if fate == "cancel" else "done"
                elif r.status_code == 410:
                    self._ended(job, r)
                else:
                    self._odd(fate, job, r)
                return
            wait_s = round(max(0.0, min(POLL_S, self.deadline - time.monotonic())), 3)
            r = await self.call("acquire", "POST", f"{base}/acquire", token, {"phase": phase, "wait_s": wait_s},
                                timeout_s=wait_s + 30)
            if self._over_for(job, "acquire", r):
                return
            answer = r.json()
            if answer.get("move"):
                seq = answer["move"]["seq"]
                r = await self.call("moved", "POST", f"{base}/moved", token, {"ok": True})
                if self._over_for(job, "moved", r):
                    return
                if seq not in job["acked_moves"]:
                    job["acked_moves"].append(seq)
                continue
            if not answer["granted"]:
                if not self.over():
                    r = await self.call("heartbeat", "POST", f"{base}/heartbeat", token, {})
                    if r is not None and r.status_code == 410:
                        return self._ended(job, r)
                    if r is not None and r.status_code != 200:
                        return self._odd("heartbeat", job, r)
                continue
            held = time.monotonic()
            await asyncio.sleep(rng.uniform(*HOLD_S))
            r = await self.call("release", "POST", f"{base}/release", token,
                                {"phase": phase, "grant_seq": answer["grant"]["seq"],
                                 "duration_s": round(time.monotonic() - held, 4)})
            if self._over_for(job, "release", r):
                return
            self.ledger.phases += 1
            if phase == "train":
                job["iterations"] += 1
                if r.json()["state"] == "done":
                    job["end"] = "done"
                    return
            phase = "train" if phase == "rollout" else "rollout"

    def _over_for(self, job: dict, endpoint: str, r: httpx.Response | None) -> bool:
        """True when answer ``r`` to a job's call ends its client's loop, recorded in ``job``:
        no answer (given up), 410 (the job has left), or any other answer but 200."""
        if r is None:
            job["end"] = "gave-up"
        elif r.status_code == 410:
            self._ended(job, r)
        elif r.status_code != 200:
            self._odd(endpoint, job, r)
        else:
            return False
        return True

    async def reader(self) -> None:
        while not self.over():
            await self.call("status", "GET", "/v1/status", self.admin)
            await self.call("metrics", "GET", "/metrics", "")
            await self.call("list", "GET", "/v1/jobs?limit=200", self.admin)
            await asyncio.sleep(min(0.5, max(0.0, self.deadline - time.monotonic())))

    async def sweep(self) -> None:
        """The admin cancels every job its client left running or silent."""
        left = [j for j in self.ledger.jobs.values() if j["end"] in ("stopped", "abandoned")]
        gate = asyncio.Semaphore(8)

        async def one(job: dict) -> None:
            async with gate:
                r = await self.call("sweep", "POST", f"/v1/jobs/{job['job_id']}/cancel", self.admin)
            if r is None:
                job["sweep"] = "gave-up"
            elif r.status_code == 200:
                job["sweep"] = "cancelled"
            elif r.status_code == 410:
                job["sweep"] = r.json().get("state") or "?"
            else:
                job["sweep"] = f"HTTP {r.status_code}"
                self.ledger.unexpected.append(f"final cancel {job['job_id']}: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(one(j) for j in left))


async def _drive(served: Served, admin: str, args: argparse.Namespace) -> tuple[Ledger, list[float], float,
                                                                               dict[str, dict], list[dict]]:
    ledger = Ledger()
    limits = httpx.Limits(max_connections=args.workers + args.readers + 16,
                          max_keepalive_connections=args.workers + args.readers + 16)
    async with httpx.AsyncClient(base_url=served.url, limits=limits) as http:
        t0 = time.monotonic()
        load = Load(http, ledger, admin, args, t0 + args.seconds)
        down: list[float] = []

        async def killer() -> None:
            for k in range(1, args.kills + 1):
                await asyncio.sleep(max(0.0, t0 + args.seconds * k / (args.kills + 1) - time.monotonic()))
                t_kill = time.monotonic()
                served.kill()
                await asyncio.sleep(DOWN_S)
                await asyncio.to_thread(served.start)
                down.append(time.monotonic() - t_kill)

        tasks = [asyncio.create_task(load.worker(w)) for w in range(args.workers)]
        tasks += [asyncio.create_task(load.reader()) for _ in range(args.readers)]
        tasks.append(asyncio.create_task(killer()))
        await asyncio.wait_for(asyncio.gather(*tasks), args.seconds + GIVE_UP_S + 90)
        load_s = time.monotonic() - t0
        await load.sweep()

        async def admin_get(path: str):
            r = await load.call("check", "GET", path, admin, timeout_s=120)
            if r is None or r.status_code != 200:
                raise RuntimeError(f"GET {path}: {'no answer' if r is None else r.status_code}")
            return r.json()

        jobs = {j["job_id"]: j for j in await admin_get("/v1/jobs?limit=10000")}
        for job_id in ledger.jobs:  # a departed record beyond --keep-ended is still answered one by one
            if job_id not in jobs:
                r = await load.call("check", "GET", f"/v1/jobs/{job_id}", admin)
                if r is not None and r.status_code == 200:
                    jobs[job_id] = r.json()
        events: list[dict] = []
        while True:
            chunk = await admin_get(f"/v1/events?since={events[-1]['seq'] if events else 0}&limit=100000")
            events += chunk
            if len(chunk) < 100000:
                break
    return ledger, down, load_s, jobs, events


# --- the checks ----------------------------------------------------------------------------------
def grant_check(events: list[dict]) -> dict:
    """From the event log: grants held twice by a job, grants never ended, and node-level
    overlaps of grant intervals (a grant lasts until the job's finish or removal)."""
    open_grants: dict[str, dict] = {}
    spans: dict[str, list[tuple]] = defaultdict(list)
    problems: list[str] = []
    for e in events:
        if e["kind"] == "grant":
            if e["job_id"] in open_grants:
                problems.append(f"{e['job_id']} granted seq {e['seq']} while holding "
                                f"seq {open_grants[e['job_id']]['seq']}")
            open_grants[e["job_id"]] = e
        elif e["kind"] in ("finish", "remove") and e["job_id"] in open_grants:
            g = open_grants.pop(e["job_id"])
            for node in g["nodes"]:
                spans[node].append((g["at"], e["at"], g["job_id"], g["seq"]))
    problems += [f"{job} never ended grant seq {g['seq']}" for job, g in open_grants.items()]
    overlaps = []
    for node, spans_ in spans.items():
        spans_.sort()
        for (s1, e1, j1, q1), (s2, _e2, j2, q2) in zip(spans_, spans_[1:]):
            if e1 > s2 + 1e-9:
                overlaps.append(f"{node}: {j1} seq {q1} until {e1:.3f} overlaps {j2} seq {q2} from {s2:.3f}")
    seqs = [e["seq"] for e in events]
    gaps = sum(1 for a, b in zip(seqs, seqs[1:]) if b > a + 1) + (1 if seqs and seqs[0] != 1 else 0)
    return {"grant_problems": problems, "overlaps": overlaps, "seq_gaps": gaps,
            "seq_dups": len(seqs) - len(set(seqs)), "seq_unordered": sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)}


def state_check(ledger: Ledger, jobs: dict[str, dict], events: list[dict]) -> tuple[list[str], list[str], dict]:
    """Each accepted job's final state, iterations and acknowledged moves against what its
    client (or the final cancel) saw. Returns (missing, mismatches, tallies)."""
    moved = Counter(e["job_id"] for e in events if e["kind"] == "moved")
    missing, bad = [], []
    tally = Counter()
    for job_id, job in ledger.jobs.items():
        end = job["end"]
        tally[end] += 1
        if job_id not in jobs:
            missing.append(job_id)
            continue
        if end in ("error", "gave-up", None):  # already failed as unexpected answers or give-ups
            continue
        seen = jobs[job_id]
        if end in ("done", "cancelled"):
            want = {end}
        elif end == "ended":  # a 410 under a client that was still calling: only a lost lease is right
            want = {"expired"}
            if job["ended_state"] == "expired":
                tally["lease lost while active"] += 1
            else:
                bad.append(f"{job_id}: its client got 410 {job['ended_state']!r} it did not cause")
        else:  # stopped or abandoned: the final cancel decided
            sweep = job.get("sweep")
            want = {"cancelled"} if sweep == "cancelled" else {"expired"}
            if sweep not in ("cancelled", "expired"):
                bad.append(f"{job_id}: the final cancel got {sweep!r}")
            elif sweep == "expired" and end == "stopped":  # the lease won the race against the final cancel
                tally["expired before the final cancel"] += 1
        if seen["state"] not in want:
            bad.append(f"{job_id}: state {seen['state']!r}, expected {'/'.join(sorted(want))} ({end})")
        if seen["iterations_done"] != job["iterations"]:
            bad.append(f"{job_id}: {seen['iterations_done']} iterations done, its client released {job['iterations']}")
        if moved[job_id] != len(job["acked_moves"]):
            bad.append(f"{job_id}: {moved[job_id]} moved events, its client acknowledged {len(job['acked_moves'])}")
    return missing, bad, dict(tally)


def run_policy(policy: str, args: argparse.Namespace, folder: Path) -> dict:
    """One policy: serve, load, stop, sweep, check; the server is always stopped."""
    admin = secrets.token_urlsafe(32)
    served = Served(folder / policy, policy, args, admin)
    t_start = time.monotonic()
    served.start()
    start_s = time.monotonic() - t_start
    try:
        ledger, down, load_s, jobs, events = asyncio.run(_drive(served, admin, args))
        log_errors = served.log_errors()
    finally:
        served.stop()
    grants = grant_check(events)
    missing, mismatches, tally = state_check(ledger, jobs, events)
    kinds = Counter(e["kind"] for e in events)
    latency = {ep: {"calls": len(xs), "p50_ms": statistics.median(xs) * 1e3,
                    "p95_ms": nearest_rank(xs, 0.95) * 1e3, "p99_ms": nearest_rank(xs, 0.99) * 1e3,
                    "max_ms": max(xs) * 1e3}
               for ep, xs in ledger.latency.items() if xs}
    consistency = {"five_xx": len(ledger.five_xx), "accepted": len(ledger.jobs),
                   "present": len(ledger.jobs) - len(missing), "mismatches": len(mismatches),
                   "overlaps": len(grants["overlaps"]), "grant_problems": len(grants["grant_problems"]),
                   "seq_gaps": grants["seq_gaps"], "seq_dups": grants["seq_dups"],
                   "seq_unordered": grants["seq_unordered"], "unexpected": len(ledger.unexpected),
                   "gave_up": len(ledger.gave_up), "log_errors": len(log_errors),
                   "not_restored": sum(1 for r in served.restored[1:] if not r)}
    ok = consistency["present"] == consistency["accepted"] and all(
        n == 0 for k, n in consistency.items() if k not in ("accepted", "present"))
    return {"policy": policy, "ok": ok, "consistency": consistency, "latency": latency,
            "start_s": start_s, "load_s": load_s, "kills_down_s": down, "phases": ledger.phases,
            "phases_per_s": ledger.phases / load_s if load_s > 0 else 0.0, "jobs_by_end": tally,
            "events": len(events), "event_kinds": dict(kinds), "moves": kinds.get("moved", 0),
            "moves_decided": kinds.get("move", 0), "regroupings": kinds.get("regroup", 0),
            "codes": {f"{ep} {code}": n for (ep, code), n in sorted(ledger.codes.items())},
            "transport_errors": {f"{ep} {name}": n for (ep, name), n in sorted(ledger.transport.items())},
            "examples": {"five_xx": ledger.five_xx[:5], "missing": missing[:5], "mismatches": mismatches[:10],
                         "overlaps": grants["overlaps"][:5], "grant_problems": grants["grant_problems"][:5],
                         "unexpected": ledger.unexpected[:5], "gave_up": ledger.gave_up[:5],
                         "log_errors": log_errors[:3]}}


def consistency_line(r: dict) -> str:
    c = r["consistency"]
    return (f"{r['policy']}: 5xx {c['five_xx']}, accepted/present {c['accepted']}/{c['present']}, "
            f"state mismatches {c['mismatches']}, overlapping grants {c['overlaps']}, grant problems "
            f"{c['grant_problems']}, seq gaps {c['seq_gaps']} dups {c['seq_dups']}, unexpected 4xx "
            f"{c['unexpected']}, gave up {c['gave_up']}, log errors {c['log_errors']}, regroupings "
            f"{r['regroupings']}, moves {r['moves']} -> {'OK' if r['ok'] else 'FAIL'}")


# --- main ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=[BASELINE, "rollmux-hedge"],
                        help="Policies to serve, one after another; the first is the baseline of the ratios.")
    parser.add_argument("--workers", type=int, default=40, help="Job clients (asyncio, one process).")
    parser.add_argument("--readers", type=int, default=2, help="Admin readers polling status, metrics, lists.")
    parser.add_argument("--seconds", type=float, default=30.0, help="Seconds of load per policy.")
    parser.add_argument("--kills", type=int, default=0, help="SIGKILL + restart the server this many times "
                                                               "during the load, at even intervals.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=12, help="Rollout nodes and train nodes (bounded pools).")
    parser.add_argument("--queue", choices=("backfill", "fifo"), default="backfill", help="rollmux serve --queue.")
    parser.add_argument("--fleet", nargs="+", default=None, metavar="GPU",
                        help="Serve a fleet file of these GPU types instead (e.g. H20 H800 H200), each a pool of "
                             "--nodes nodes in any role; the jobs' profiles are on H20/H800.")
    parser.add_argument("--iterations", default="3,8", help="Iterations per job: a,b (drawn uniformly).")
    parser.add_argument("--lease-s", type=float, default=10.0)
    parser.add_argument("--grace-s", type=float, default=5.0)
    parser.add_argument("--migration-s", type=float, default=0.5, help="rollmux serve --migration-s.")
    parser.add_argument("--workdir", type=Path, default=None, help="Keep state files and logs here "
                                                                    "(default: a temporary folder, removed).")
    parser.add_argument("--json", type=Path, default=None, help="Write every number to this file.")
    args = parser.parse_args(argv)
    try:
        lo, hi = (int(x) for x in args.iterations.split(","))
    except ValueError:
        lo, hi = 0, 0
    if not 1 <= lo <= hi:
        parser.error("--iterations a,b with 1 <= a <= b")
    args.iterations = (lo, hi)
    if args.workers < 1 or args.seconds <= 0 or args.kills < 0 or args.nodes < 1:
        parser.error("--workers >= 1, --seconds > 0, --kills >= 0, --nodes >= 1")
    from rollmux.cli_service import LivePolicy  # (the names rollmux serve --policy takes)

    known = [p.value for p in LivePolicy]
    unknown = [p for p in args.policies if p not in known]
    if unknown:
        parser.error(f"--policies {' '.join(unknown)}: expected names among {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="service_load-") as tmp:
        folder = args.workdir or Path(tmp)
        for policy in args.policies:
            results.append(run_policy(policy, args, folder))
    base = results[0]
    print(f"service load: {args.workers} job clients + {args.readers} admin readers, {args.seconds:g}s per policy, "
          f"{args.nodes}+{args.nodes} nodes, lease {args.lease_s:g}s + grace {args.grace_s:g}s, {args.kills} "
          f"SIGKILL(s), seed {args.seed}; x base = p50 over {base['policy']}'s (same workload, this run)")
    print(f"{'policy':<20} {'endpoint':<10} {'calls':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'x base':>7}")
    for r in results:
        for ep in ENDPOINTS:
            s = r["latency"].get(ep)
            if s is None:
                continue
            b = base["latency"].get(ep)
            x = f"{s['p50_ms'] / b['p50_ms']:.2f}" if b and ep != "acquire" else "-"
            s["x_base"] = None if x == "-" else float(x)
            print(f"{r['policy']:<20} {ep:<10} {s['calls']:>7} {s['p50_ms']:>8.1f} {s['p95_ms']:>8.1f} "
                  f"{s['p99_ms']:>8.1f} {s['max_ms']:>8.1f} {x:>7}")
    print("acquire is a long poll (wait_s up to 5): its latency is mostly the wait.")
    print()
    for r in results:
        ends = ", ".join(f"{k} {v}" for k, v in sorted(r["jobs_by_end"].items()))
        kills = ", ".join(f"{s:.1f}" for s in r["kills_down_s"]) or "-"
        print(f"{r['policy']}: {r['consistency']['accepted']} jobs ({ends}); {r['phases']} phases released "
              f"({r['phases_per_s']:.0f}/s); {r['moves']} moves acknowledged ({r['moves_decided']} decided), "
              f"{r['regroupings']} regroupings; s from SIGKILL to serving: {kills} "
              f"({sum(r['transport_errors'].values())} connection errors retried)")
    for r in results[1:]:
        ratios = []
        for ep in RATIO_ENDPOINTS:
            s, b = r["latency"].get(ep), base["latency"].get(ep)
            if s and b:
                ratios.append(f"{ep} {s['p50_ms'] / b['p50_ms']:.2f}x")
        tput = r["phases_per_s"] / base["phases_per_s"] if base["phases_per_s"] else float("nan")
        r["ratios"] = {"release_p50_x": _ratio(r, base, "release"), "submit_p50_x": _ratio(r, base, "submit"),
                       "phases_per_s_x": tput}
        print(f"p50 {r['policy']} over {base['policy']}: {', '.join(ratios) or '-'}; phases/s {tput:.2f}x")
    print()
    print("consistency:")
    for r in results:
        print("  " + consistency_line(r))
        if not r["ok"]:
            for kind, examples in r["examples"].items():
                for e in examples:
                    print(f"    {kind}: {e}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v)
                                                  for k, v in vars(args).items()},
                                         "cpus": os.cpu_count(), "results": results}, indent=2, default=str))
        print(f"\nwrote {args.json}")
    return 0 if all(r["ok"] for r in results) else 1


def _ratio(r: dict, base: dict, ep: str) -> float | None:
    s, b = r["latency"].get(ep), base["latency"].get(ep)
    return s["p50_ms"] / b["p50_ms"] if s and b else None


if __name__ == "__main__":
    sys.exit(main())
