"""RollMux's online policies against the offline optimum, over time, on small traces.

Each trace is synthetic (``rollmux trace generate`` rules) with arrivals spread out so
that at most ~8 jobs are present at once, which keeps the exact solver tractable. The
optimum is the ``optimal`` cost curve: the exact solver re-plans the present jobs at
every arrival and departure, with free regrouping and no migration cost, so it is a
lower bound no online policy can reach. Prints total cost per policy and the ratio to
the bound; worst-case phase times.

    python benchmarks/online_vs_optimal.py [--traces 6] [--jobs 40]
"""
from __future__ import annotations

import argparse
import statistics

from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.sim.optimal_curve import max_concurrency, optimal_curve
from rollmux.traces.generate import generate

POLICIES = ("rollmux", "rollmux-consolidate", "rollmux-regroup", "rollmux-bestfit", "solo-d")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--interarrival-s", type=float, default=40_000.0)
    args = ap.parse_args()
    cluster = Cluster()
    ratios: dict[str, list[float]] = {p: [] for p in POLICIES}
    print(f"{'seed':>4} {'max jobs':>8} {'optimal $':>10} " + " ".join(f"{p:>20}" for p in POLICIES))
    for seed in range(args.traces):
        jobs = generate(args.jobs, seed, mean_interarrival_s=args.interarrival_s)
        bound = optimal_curve(jobs, cluster).total_cost
        row = []
        for name in POLICIES:
            cost = simulate(jobs, cluster, make_policy(name, seed)).total_cost
            ratios[name].append(cost / bound)
            row.append(f"{cost:>11,.0f} ({cost / bound:.3f})")
        print(f"{seed:>4} {max_concurrency(jobs):>8} {bound:>10,.0f} " + " ".join(f"{c:>20}" for c in row))
    print("mean ratio to the bound: " + ", ".join(f"{p} {statistics.mean(r):.3f}" for p, r in ratios.items()))


if __name__ == "__main__":
    main()
