"""How far the online planner lands from the offline optimum on small instances.

Each instance is n jobs (n uniform in [--min-jobs, --max-jobs]) present at once, with
the simulation study's synthetic profiles (facts section 9): a profile family
(balanced, rollout-heavy or train-heavy; "mixed" draws one per job) and a size S/M/L,
each phase uniform in its range; 8 rollout and 8 training GPUs; SLO uniform in [1, 2];
a model size (3B/7B/14B/32B) that sets host memory per node (Table 2) and the warm
switch seconds. The planner (``tie_break`` "first" = Algorithm 1, and "best-fit")
places the jobs one at a time in arrival order into a fresh plan; ``rollmux.exact``
gives the optimum for the same admission order, both steady-state ("steady": SLOs of
the full groups) and departure-robust ("robust": SLOs of every subset of each group,
which the planner also enforces). Reported: planner cost / optimal cost (mean,
median, p90, max, share exactly optimal) against each, and the exact solver's
seconds by instance size (steady and robust solves).

    python benchmarks/planner_vs_exact.py [--instances 200] [--seed 0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from rollmux.exact import solve
from rollmux.improve import improve
from rollmux.model import Cluster, Job, PoolSpec
from rollmux.plan_state import PlanState
from rollmux.planner import Planner

#: Phase ranges in seconds, (rollout, train) per size S/M/L (facts section 9).
PROFILES = {
    "balanced": {"S": ((50, 100), (50, 100)), "M": ((100, 200), (100, 200)), "L": ((200, 300), (200, 300))},
    "rollout-heavy": {"S": ((100, 200), (25, 50)), "M": ((200, 400), (50, 100)), "L": ((400, 600), (100, 200))},
    "train-heavy": {"S": ((25, 50), (100, 200)), "M": ((50, 100), (200, 400)), "L": ((100, 200), (400, 600))},
}
#: Host memory per node, GB, (rollout, train) by model size (Table 2).
MEMORY = {"3B": (113.4, 156.2), "7B": (275.7, 240.0), "14B": (445.4, 456.1), "32B": (490.3, 520.4)}
TIE_BREAKS = ("first", "best-fit")
VARIANTS = ("first", "first+improve", "best-fit", "best-fit+improve")
OPTIMA = ("steady", "robust")


def make_jobs(rng: random.Random, n: int, mix: str) -> list[Job]:
    jobs = []
    for i in range(n):
        family = rng.choice(list(PROFILES)) if mix == "mixed" else mix
        (r_lo, r_hi), (t_lo, t_hi) = PROFILES[family][rng.choice("SML")]
        model = rng.choice(list(MEMORY))
        jobs.append(Job(f"j{i}", rng.uniform(r_lo, r_hi), rng.uniform(t_lo, t_hi), 8, 8,
                        MEMORY[model][0], MEMORY[model][1], slo=rng.uniform(1.0, 2.0),
                        model=model, arrival_s=float(i)))
    return jobs


def planner_costs(cluster: Cluster, jobs: list[Job], tie_break: str) -> tuple[float, float, float]:
    """Cost after placing the jobs in arrival order, cost after ``improve``, seconds improving."""
    planner, state = Planner(tie_break), PlanState(cluster)
    for job in jobs:  # already in arrival order
        state.apply(job, planner.decide(state, job).placement)
    start = time.perf_counter()
    result = improve(state)
    return result.cost_before, result.cost_after, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def run(instances: int, seed: int, min_jobs: int, max_jobs: int, mix: str, host_mem_gb: float) -> dict:
    rng = random.Random(seed)
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, host_mem_gb), train=PoolSpec("H800", 5.28, host_mem_gb))
    ratios: dict[str, list[float]] = {f"{t} / {o}": [] for t in VARIANTS for o in OPTIMA}
    improve_s: list[float] = []
    by_size: dict[int, list[dict]] = {}
    for _ in range(instances):
        jobs = make_jobs(rng, rng.randint(min_jobs, max_jobs), mix)
        optima = {o: solve(cluster, jobs, robust=(o == "robust")) for o in OPTIMA}
        by_size.setdefault(len(jobs), []).append(
            {o: (s.stats.seconds, s.stats.analyze_calls, s.stats.subsets_searched) for o, s in optima.items()})
        for tie_break in TIE_BREAKS:
            online, improved, seconds = planner_costs(cluster, jobs, tie_break)
            improve_s.append(seconds)
            for o, s in optima.items():
                ratios[f"{tie_break} / {o}"].append(online / s.cost_per_hour)
                ratios[f"{tie_break}+improve / {o}"].append(improved / s.cost_per_hour)
    summary = {k: {"mean": statistics.fmean(r), "median": statistics.median(r), "p90": percentile(r, 90),
                   "max": max(r), "min": min(r), "exactly_optimal": sum(x <= 1 + 1e-9 for x in r) / len(r)}
               for k, r in ratios.items()}
    sizes = {n: {o: {"instances": len(rows), "mean_s": statistics.fmean(r[o][0] for r in rows),
                     "max_s": max(r[o][0] for r in rows),
                     "mean_analyze_calls": statistics.fmean(r[o][1] for r in rows),
                     "mean_subsets_searched": statistics.fmean(r[o][2] for r in rows)} for o in OPTIMA}
             for n, rows in sorted(by_size.items())}
    return {"config": {"instances": instances, "seed": seed, "jobs": [min_jobs, max_jobs], "mix": mix,
                       "host_mem_gb": host_mem_gb}, "ratio": summary, "exact_by_size": sizes,
            "improve_s": {"mean": statistics.fmean(improve_s), "p90": percentile(improve_s, 90),
                          "max": max(improve_s)}}


def print_tables(result: dict) -> None:
    cfg = result["config"]
    print(f"{cfg['instances']} instances, {cfg['jobs'][0]}-{cfg['jobs'][1]} jobs, mix={cfg['mix']}, "
          f"host memory {cfg['host_mem_gb']:.0f} GB, seed {cfg['seed']}")
    print("\nplanner cost / optimal cost")
    print(f"{'planner / optimum':<28} {'mean':>7} {'median':>7} {'p90':>7} {'max':>7} {'optimal':>8}")
    for k, s in result["ratio"].items():
        print(f"{k:<28} {s['mean']:7.3f} {s['median']:7.3f} {s['p90']:7.3f} {s['max']:7.3f} "
              f"{100 * s['exactly_optimal']:7.1f}%")
    imp = result["improve_s"]
    print(f"\nimprove: mean {imp['mean']:.3f} s, p90 {imp['p90']:.3f} s, max {imp['max']:.3f} s per instance")
    print("\nexact solver by instance size")
    print(f"{'jobs':>4} {'n':>4} {'optimum':>8} {'mean s':>8} {'max s':>8} {'analyze':>8} {'subsets':>8}")
    for n, row in result["exact_by_size"].items():
        for o, s in row.items():
            print(f"{n:>4} {s['instances']:>4} {o:>8} {s['mean_s']:8.3f} {s['max_s']:8.3f} "
                  f"{s['mean_analyze_calls']:8.0f} {s['mean_subsets_searched']:8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-jobs", type=int, default=5)
    parser.add_argument("--max-jobs", type=int, default=9)
    parser.add_argument("--mix", choices=["mixed", *PROFILES], default="mixed")
    parser.add_argument("--host-mem-gb", type=float, default=2048.0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    start = time.perf_counter()
    result = run(args.instances, args.seed, args.min_jobs, args.max_jobs, args.mix, args.host_mem_gb)
    result["wall_s"] = time.perf_counter() - start
    print_tables(result)
    print(f"\nwall {result['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
