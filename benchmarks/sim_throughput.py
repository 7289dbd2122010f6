"""Simulator throughput: events per second and wall time per policy on one trace.

The baseline, measured in the same run, is a bare heap loop that pushes and pops the
same number of timestamped events and does nothing else: the floor any discrete-event
engine in Python pays. The ratio says how many times that floor each policy costs.

    python benchmarks/sim_throughput.py [--trace philly-mix] [--duration-model worst]
"""
from __future__ import annotations

import argparse
import heapq
import time

from rollmux.model import Cluster
from rollmux.policies import DEFAULT_POLICIES, make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace


def bare_heap(events: int) -> float:
    start = time.perf_counter()
    heap: list[tuple[float, int, int]] = []
    t = 0.0
    for i in range(events):
        heapq.heappush(heap, (t + (i * 7919) % 1000, 0, i))
        if len(heap) > 64:
            t = heapq.heappop(heap)[0]
    while heap:
        heapq.heappop(heap)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="philly-mix")
    ap.add_argument("--duration-model", default="worst")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cluster = Cluster()
    jobs, info = load_trace(args.trace, cluster, args.seed)
    print(f"trace {info['name']}: {info['jobs']} jobs, {info['span_hours']} h of arrivals")
    print(f"{'policy':<20} {'events':>9} {'wall s':>8} {'events/s':>10} {'x bare heap':>12}")
    total = 0.0
    for name in DEFAULT_POLICIES:
        r = simulate(jobs, cluster, make_policy(name, args.seed), args.duration_model, args.seed)
        floor = bare_heap(r.events)
        total += r.wall_s
        print(f"{name:<20} {r.events:>9} {r.wall_s:>8.2f} {r.events / r.wall_s:>10,.0f} {r.wall_s / floor:>11.1f}x")
    print(f"all policies: {total:.1f} s")


if __name__ == "__main__":
    main()
