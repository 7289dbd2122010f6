"""How far the online planner lands from the offline optimum on small instances, in the
paper's placement space and in the full one (training scaling and co-location).

Each instance is n jobs (n uniform in [--min-jobs, --max-jobs]) present at once, with
the simulation study's synthetic profiles (facts section 9): a profile family
(balanced, rollout-heavy or train-heavy; "mixed" draws one per job) and a size S/M/L,
each phase uniform in its range; 8 rollout and 8 training GPUs; SLO uniform in [1, 2];
a model size (3B/7B/14B/32B) that sets host memory per node (Table 2) and the warm
switch seconds. Planners place the jobs one at a time in arrival order into a fresh
plan: Algorithm 1 ("first") and "best-fit" in the paper's space, "full first"
(``rollmux.planner.FULL_SPACE``) and "host first" (the paper's space plus hosting,
``HOSTING_SPACE``); "+improve" regroups the result with exact solves in
the planner's space (``rollmux.improve``). ``rollmux.exact`` gives the departure-robust
optimum (SLOs of every subset of each group, which the planner also enforces) in each
of the three spaces, for the same admission order. Costs are the planner's objective
(``PlanState.effective_cost_per_hour``: $/h, a co-located job's nodes counted at its
slowdown). Reported per profile mix: each plan's cost over each space's optimum
(mean, median, p90, max, share exactly optimal), and the
exact solver's seconds by instance size in each space.

    python benchmarks/planner_vs_exact.py [--instances 40] [--mix mixed,train-heavy,rollout-heavy]
                                          [--seed 0] [--json out.json]
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
from rollmux.planner import FULL_SPACE, HOSTING_SPACE, PAPER_SPACE, Planner

#: Phase ranges in seconds, (rollout, train) per size S/M/L (facts section 9).
PROFILES = {
    "balanced": {"S": ((50, 100), (50, 100)), "M": ((100, 200), (100, 200)), "L": ((200, 300), (200, 300))},
    "rollout-heavy": {"S": ((100, 200), (25, 50)), "M": ((200, 400), (50, 100)), "L": ((400, 600), (100, 200))},
    "train-heavy": {"S": ((25, 50), (100, 200)), "M": ((50, 100), (200, 400)), "L": ((100, 200), (400, 600))},
}
#: Host memory per node, GB, (rollout, train) by model size (Table 2).
MEMORY = {"3B": (113.4, 156.2), "7B": (275.7, 240.0), "14B": (445.4, 456.1), "32B": (490.3, 520.4)}
#: Online planners: name -> (tie break, placement space).
PLANNERS = {"first": ("first", PAPER_SPACE), "best-fit": ("best-fit", PAPER_SPACE),
            "full first": ("first", FULL_SPACE), "host first": ("first", HOSTING_SPACE)}
OPTIMA = {"paper": PAPER_SPACE, "full": FULL_SPACE, "host": HOSTING_SPACE}
MIXES = ("mixed", "train-heavy", "rollout-heavy")


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


def planner_costs(cluster: Cluster, jobs: list[Job], tie_break: str, space) -> tuple[float, float, float]:
    """Objective after placing the jobs in arrival order, after ``improve`` in the same space,
    and the seconds improving took."""
    planner, state = Planner(tie_break, space=space), PlanState(cluster)
    for job in jobs:  # already in arrival order
        state.apply(job, planner.decide(state, job).placement)
    online = state.effective_cost_per_hour()
    start = time.perf_counter()
    improve(state, space=space)
    return online, state.effective_cost_per_hour(), time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def run(instances: int, seed: int, min_jobs: int, max_jobs: int, mixes: list[str], host_mem_gb: float) -> dict:
    cluster = Cluster(rollout=PoolSpec("H20", 1.85, host_mem_gb), train=PoolSpec("H800", 5.28, host_mem_gb))
    out: dict = {"config": {"instances": instances, "seed": seed, "jobs": [min_jobs, max_jobs], "mixes": mixes,
                            "host_mem_gb": host_mem_gb}, "mixes": {}}
    for mix in mixes:
        rng = random.Random(f"{seed}-{mix}")
        costs: dict[str, list[float]] = {}
        improve_s: list[float] = []
        by_size: dict[int, list[dict]] = {}
        for _ in range(instances):
            jobs = make_jobs(rng, rng.randint(min_jobs, max_jobs), mix)
            optima = {o: solve(cluster, jobs, robust=True, space=sp) for o, sp in OPTIMA.items()}
            by_size.setdefault(len(jobs), []).append({o: s.stats.seconds for o, s in optima.items()})
            row = {f"optimum {o}": s.objective for o, s in optima.items()}
            for name, (tie_break, space) in PLANNERS.items():
                online, improved, seconds = planner_costs(cluster, jobs, tie_break, space)
                improve_s.append(seconds)
                row[name], row[f"{name}+improve"] = online, improved
            for k, v in row.items():
                costs.setdefault(k, []).append(v)
        ratios = {}
        for ref in OPTIMA:
            base = costs[f"optimum {ref}"]
            for k, values in costs.items():
                r = [v / b for v, b in zip(values, base)]
                ratios[f"{k} / optimum {ref}"] = {
                    "mean": statistics.fmean(r), "median": statistics.median(r), "p90": percentile(r, 90),
                    "max": max(r), "min": min(r), "exactly_optimal": sum(x <= 1 + 1e-9 for x in r) / len(r)}
        sizes = {n: {o: {"instances": len(rows), "mean_s": statistics.fmean(r[o] for r in rows),
                         "max_s": max(r[o] for r in rows)} for o in OPTIMA}
                 for n, rows in sorted(by_size.items())}
        out["mixes"][mix] = {"ratio": ratios, "exact_by_size": sizes,
                             "improve_s": {"mean": statistics.fmean(improve_s), "max": max(improve_s)}}
    return out


def print_tables(result: dict) -> None:
    cfg = result["config"]
    print(f"{cfg['instances']} instances per mix, {cfg['jobs'][0]}-{cfg['jobs'][1]} jobs, "
          f"host memory {cfg['host_mem_gb']:.0f} GB, seed {cfg['seed']}")
    for mix, res in result["mixes"].items():
        print(f"\n== mix {mix}: plan cost / optimum (cost = $/h, co-located nodes at their slowdown)")
        print(f"{'plan / optimum':<38} {'mean':>7} {'median':>7} {'p90':>7} {'max':>7} {'optimal':>8}")
        for k, s in res["ratio"].items():
            print(f"{k:<38} {s['mean']:7.3f} {s['median']:7.3f} {s['p90']:7.3f} {s['max']:7.3f} "
                  f"{100 * s['exactly_optimal']:7.1f}%")
        imp = res["improve_s"]
        print(f"improve: mean {imp['mean']:.3f} s, max {imp['max']:.3f} s per instance")
        print(f"{'jobs':>4} {'n':>4} {'space':>6} {'mean s':>8} {'max s':>8}")
        for n, row in res["exact_by_size"].items():
            for o, s in row.items():
                print(f"{n:>4} {s['instances']:>4} {o:>6} {s['mean_s']:8.3f} {s['max_s']:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=40, help="instances per mix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-jobs", type=int, default=4)
    parser.add_argument("--max-jobs", type=int, default=6)
    parser.add_argument("--mix", default=",".join(MIXES),
                        help=f"comma-separated profile mixes among {', '.join(('balanced',) + MIXES)}")
    parser.add_argument("--host-mem-gb", type=float, default=2048.0)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    mixes = [m.strip() for m in args.mix.split(",") if m.strip()]
    for mix in mixes:
        if mix != "mixed" and mix not in PROFILES:
            parser.error(f"--mix {mix!r}: expected mixed or one of {', '.join(PROFILES)}")
    start = time.perf_counter()
    result = run(args.instances, args.seed, args.min_jobs, args.max_jobs, mixes, args.host_mem_gb)
    result["wall_s"] = time.perf_counter() - start
    print_tables(result)
    print(f"\nwall {result['wall_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
