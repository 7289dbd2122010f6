"""What choosing GPU types per job is worth, and how close the fleet planner gets.

Each instance is n jobs (n uniform in [--min-jobs, --max-jobs]) present at once on the
three-type fleet of examples/fleet/three_types.yaml (H20, H800, H200, every pool in both
roles: 9 views), with the synthetic profiles of benchmarks/planner_vs_exact.py measured
on the reference types (H20 rollout, H800 training). Each job also gets, with
probability 1/3 each, a measured H200 rollout 1.5-2.5x faster than on H20 (long
contexts that fit H200's memory), a measured H200 training 1.2-1.6x faster than on
H800, or neither (the roofline rule applies). Reported, as the fleet objective E
(``rollmux.fleet_planner``) over the fleet's exact optimum (``rollmux.fleet_exact``,
departure-robust):

* ``best fixed view``: the exact optimum confined to the single best view (the best
  fixed assignment of types, found exactly);
* ``paper roles``: the exact optimum confined to H20/H800 (the paper's roles);
* ``fleet greedy``: the fleet planner placing in arrival order;
* ``fleet +improve``: the same, then regrouped (``improve_fleet``).

    python benchmarks/fleet_vs_exact.py [--instances 30] [--min-jobs 4] [--max-jobs 5]
                                        [--space paper|full] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from rollmux.fleet import Profiles
from rollmux.fleet_exact import improve_fleet, solve_fleet
from rollmux.fleet_file import load_fleet
from rollmux.fleet_planner import FleetPlanner, plan_jobs
from rollmux.planner import FULL_SPACE, PAPER_SPACE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner_vs_exact import make_jobs  # noqa: E402

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet" / "three_types.yaml"


def profiles_for(rng: random.Random, jobs) -> Profiles:
    table = {}
    for job in jobs:
        draw = rng.random()
        if draw < 1 / 3:
            table[(job.job_id, "H200")] = (job.t_roll_s / rng.uniform(1.5, 2.5), None)
        elif draw < 2 / 3:
            table[(job.job_id, "H200")] = (None, job.t_train_s / rng.uniform(1.2, 1.6))
    return Profiles(table)


def summary(ratios: list[float]) -> str:
    ordered = sorted(ratios)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    exact = sum(r <= 1 + 1e-9 for r in ratios) / len(ratios)
    return (f"{statistics.fmean(ratios):>7.3f} {statistics.median(ratios):>7.3f} {p90:>7.3f} {max(ratios):>7.3f} "
            f"{100 * exact:>6.0f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=30)
    ap.add_argument("--min-jobs", type=int, default=4)
    ap.add_argument("--max-jobs", type=int, default=5)
    ap.add_argument("--space", default="paper", choices=("paper", "full"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    space = FULL_SPACE if args.space == "full" else PAPER_SPACE
    fleet = load_fleet(FLEET)
    rng = random.Random(args.seed)
    rows: dict[str, list[float]] = {"best fixed view": [], "paper roles (H20/H800)": [], "fleet greedy": [],
                                    "fleet +improve": []}
    solve_s: list[float] = []
    start = time.perf_counter()
    for i in range(args.instances):
        jobs = make_jobs(rng, rng.randint(args.min_jobs, args.max_jobs), "mixed")
        profiles = profiles_for(rng, jobs)
        t0 = time.perf_counter()
        optimum = solve_fleet(fleet, jobs, profiles, space, robust=True).objective
        solve_s.append(time.perf_counter() - t0)
        fixed = {v.name: solve_fleet(fleet, jobs, profiles, space, robust=True, only=(v.name,)).objective
                 for v in fleet.views()}
        rows["best fixed view"].append(min(fixed.values()) / optimum)
        rows["paper roles (H20/H800)"].append(fixed["H20/H800"] / optimum)
        state, _ = plan_jobs(FleetPlanner(fleet, profiles, space=space), jobs)
        rows["fleet greedy"].append(state.effective_cost_per_hour() / optimum)
        improve_fleet(state, space)
        rows["fleet +improve"].append(state.effective_cost_per_hour() / optimum)
        print(f"\r{i + 1}/{args.instances} instances, {time.perf_counter() - start:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    print(f"{args.instances} instances of {args.min_jobs}-{args.max_jobs} jobs on H20+H800+H200, "
          f"{args.space} space; E over the fleet optimum")
    print(f"{'plan':<24} {'mean':>7} {'median':>7} {'p90':>7} {'max':>7} {'exact':>7}")
    for name, ratios in rows.items():
        print(f"{name:<24} {summary(ratios)}")
    print(f"fleet exact solver: median {statistics.median(solve_s):.2f} s, max {max(solve_s):.2f} s per instance")


if __name__ == "__main__":
    main()
