"""Grant latency of the live control plane on loopback, next to the in-process cost of a grant.

Usage: python benchmarks/control_plane.py [--clients 10 50] [--iterations 15] [--phase-s 0.02]

Service: ``rollmux serve`` in a subprocess on 127.0.0.1 (unbounded pools, no switch
cost, a fresh state file, so every change pays its SQLite commit). Clients: one SDK
``JobHandle`` per thread of this process, each running rollout/train iterations whose
bodies sleep ``phase_s``.

Grant latency of one phase entry = (time the client holds the grant) - max(time the
service made the grant, time the client asked). It is the long-poll wake-up when the
client was already waiting, and the request round trip when the grant was already there.

In process: the same step without HTTP or disk: ``ControlPlane.release`` of one member
of a two-member group (which ends its phase and dispatches the next grant), and
``GroupExecutor.finish`` + ``dispatch`` alone; plus the snapshot + SQLite commit that
the service adds to every change.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from rollmux import Client
from rollmux.execution import GroupExecutor
from rollmux.model import Cluster, Job, SwitchCost
from rollmux.runtime.control import ControlPlane
from rollmux.runtime.store import Store


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _serve(tmp: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp / "cluster.yaml").write_text("switch_cost_s: 0\n")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("rollmux")), "serve", "--cluster",
                             str(tmp / "cluster.yaml"), "--state", str(tmp / "state.db"), "--port", str(port),
                             "--admin-token", "bench", "--lease-s", "60"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("service did not start")


def loopback(n_clients: int, iterations: int, phase_s: float) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _serve(Path(tmp))
        latencies: list[float] = []
        lock = threading.Lock()

        def client(i: int) -> None:
            job = Client(url, poll_s=5.0).submit({"job_id": f"j{i}", "t_roll_s": phase_s, "t_train_s": phase_s,
                                                  "slo": 2.0, "iterations": iterations})
            mine = []
            for _ in range(iterations):
                for name in ("rollout", "train"):
                    asked = time.time()
                    with job.phase(name) as ph:
                        mine.append(time.time() - max(asked, ph.grant["granted_at"]))
                        time.sleep(phase_s)
            job.complete()
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            proc.kill()
            proc.wait()
        return latencies


def in_process(rounds: int = 2000) -> dict[str, float]:
    cluster = Cluster(switch_cost=SwitchCost("fixed"))
    cp = ControlPlane(cluster)
    for job_id in ("a", "b"):
        cp.submit(Job(job_id, 10.0, 10.0, slo=2.0), 0.0)
    now, t0 = 1.0, time.perf_counter()
    for _ in range(rounds):
        for rec in list(cp.jobs.values()):
            if rec.grant is not None:
                cp.release(rec.job_id, rec.grant.pool, rec.grant.seq, 1.0, now)
                now += 1.0
                break
    control_us = (time.perf_counter() - t0) / rounds * 1e6

    ex = GroupExecutor()
    ex.admit("a", ("R0",), ("T0",), 0.0)
    ex.admit("b", ("R0",), ("T0",), 0.0)
    running = {g.job_id for g in ex.dispatch(0.0)}
    t0 = time.perf_counter()
    for i in range(rounds):
        job_id = next(iter(running))
        ex.finish(job_id, float(i))
        running.discard(job_id)
        running |= {g.job_id for g in ex.dispatch(float(i))}
    executor_us = (time.perf_counter() - t0) / rounds * 1e6

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.db")
        t0 = time.perf_counter()
        for _ in range(200):
            store.commit(cp.snapshot(), cp.take_events())
        commit_us = (time.perf_counter() - t0) / 200 * 1e6
        store.close()
    return {"executor": executor_us, "control": control_us, "commit": commit_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--phase-s", type=float, default=0.02)
    args = parser.parse_args()
    base = in_process()
    print(f"in process: GroupExecutor finish+dispatch {base['executor']:.1f} us, "
          f"ControlPlane.release (ends a phase, grants the next) {base['control']:.1f} us, "
          f"snapshot+SQLite commit {base['commit']:.1f} us")
    print(f"{'clients':>8} {'grants':>7} {'median ms':>10} {'p99 ms':>8} {'x in-process':>13}")
    for n in args.clients:
        lat = loopback(n, args.iterations, args.phase_s)
        med, p99 = statistics.median(lat) * 1e3, _pct(lat, 0.99) * 1e3
        print(f"{n:>8} {len(lat):>7} {med:>10.2f} {p99:>8.2f} {med * 1e3 / base['control']:>13.0f}")


if __name__ == "__main__":
    main()
