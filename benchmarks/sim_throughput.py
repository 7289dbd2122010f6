"""Simulator throughput: the event-by-event engine against the fast-forward, then the full Philly trace.

Part 1 (baseline in the same run): every default policy on a builtin trace (philly-mix by
default) twice, ``fast_forward=False`` (every phase an event) and ``True`` (groups whose
schedule repeats skip whole periods, ``rollmux.sim.periodic``). The results are asserted
equal (same jobs, groups, iterations; times and cost to 1e-9 relative) and the table gives
events and wall time of each, and the speed-up.

Part 2: the whole public Philly trace (111,549 rows; ``rollmux trace from-philly`` with
the default mapping) through rollmux, solo-d and colocated, each in a child process so
that its peak memory (max RSS) is its own. Target on the project's 2-core machine: all
three under 10 minutes together, each under 2 GB.

    python benchmarks/sim_throughput.py [--trace philly-mix] [--philly PATH | --no-full]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollmux.model import Cluster
from rollmux.policies import DEFAULT_POLICIES, make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace
from rollmux.traces.philly import convert_philly

RAW = Path(__file__).resolve().parents[2] / "shared" / "traces" / "rfold_philly_trace.csv"
FULL_POLICIES = ("rollmux", "solo-d", "colocated")
REL = 1e-9

_CHILD = """
import json, resource, sys, time
from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.format import read_trace
cluster = Cluster()
jobs = read_trace(sys.argv[1], cluster)
r = simulate(jobs, cluster, make_policy(sys.argv[2], 0), "worst", 0)
print(json.dumps({"wall_s": r.wall_s, "events": r.events, "cost_per_hour": r.cost_per_hour,
                  "slo": r.slo_attainment, "jobs": len(r.jobs),
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def same(a, b) -> bool:
    def close(x: float, y: float) -> bool:
        return abs(x - y) <= REL * max(1.0, abs(x), abs(y))

    return (len(a.jobs) == len(b.jobs) and a.rejected == b.rejected and close(a.total_cost, b.total_cost)
            and all((x.job_id, x.group_id, x.outcome, x.iterations) == (y.job_id, y.group_id, y.outcome, y.iterations)
                    and close(x.placed_s, y.placed_s) and close(x.end_s, y.end_s) for x, y in zip(a.jobs, b.jobs)))


def engines(trace: str, seed: int) -> None:
    cluster = Cluster()
    jobs, info = load_trace(trace, cluster, seed)
    print(f"trace {info['name']}: {info['jobs']} jobs, {info['span_hours']} h of arrivals, worst-case durations")
    print(f"{'policy':<18} {'events (each)':>14} {'events (skip)':>14} {'wall s (each)':>14} {'wall s (skip)':>14} "
          f"{'speed-up':>9} {'same':>5}")
    for name in DEFAULT_POLICIES:
        slow = simulate(jobs, cluster, make_policy(name, seed), "worst", seed, fast_forward=False)
        fast = simulate(jobs, cluster, make_policy(name, seed), "worst", seed, fast_forward=True)
        ok = same(slow, fast)
        print(f"{name:<18} {slow.events:>14,} {fast.events:>14,} {slow.wall_s:>14.2f} {fast.wall_s:>14.2f} "
              f"{slow.wall_s / fast.wall_s:>8.1f}x {'yes' if ok else 'NO':>5}")
        if not ok:
            raise SystemExit(f"{name}: fast-forward results differ from event-by-event")


def full(raw: Path, policies: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "philly_full.csv"
        convert_philly(raw, trace)
        lines = sum(1 for _ in open(trace)) - 1
        print(f"\nfull Philly trace: {lines:,} jobs ({raw.name}, default mapping)")
        print(f"{'policy':<12} {'wall s':>8} {'events':>12} {'$/h':>12} {'SLO met':>9} {'max RSS MB':>11}")
        total = 0.0
        for name in policies:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", _CHILD, str(trace), name], check=True,
                                  capture_output=True, text=True)
            elapsed = time.perf_counter() - started
            total += elapsed
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{name:<12} {r['wall_s']:>8.1f} {r['events']:>12,} {r['cost_per_hour']:>12,.1f} "
                  f"{100 * r['slo']:>7.3f}% {r['max_rss_mb']:>11,.0f}")
        print(f"{', '.join(policies)}, child processes included: {total:.1f} s (target for all three: < 600 s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="philly-mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--philly", type=Path, default=RAW, help="the raw Philly file for part 2")
    ap.add_argument("--no-full", action="store_true", help="skip part 2")
    ap.add_argument("--full-policies", default=",".join(FULL_POLICIES), help="policies of part 2")
    args = ap.parse_args()
    engines(args.trace, args.seed)
    if not args.no_full:
        if not args.philly.exists():
            raise SystemExit(f"{args.philly}: no such file (pass --philly PATH or --no-full)")
        full(args.philly, tuple(p.strip() for p in args.full_policies.split(",") if p.strip()))


if __name__ == "__main__":
    main()
