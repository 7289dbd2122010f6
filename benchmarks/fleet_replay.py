"""Replays on a fleet of three GPU types: RollMux against every baseline over types.

Each instance is --jobs jobs with the synthetic profiles and per-type H200 profiles of
benchmarks/fleet_vs_exact.py, arriving uniformly over --window-h hours and running 5-20
hours alone, replayed under worst-case durations on examples/fleet/three_types.yaml by
``rollmux fleet simulate``'s policies (``rollmux.policies.fleet.fleet_policies``): the
fleet planner in the --space chosen against every baseline and fixed view. Per
instance: RollMux's total $, the cheapest other policy with at least RollMux's SLO
attainment, and the ratio; then the mean and worst ratio, how often RollMux lost, and
to whom. The other RollMux policies (the other space, the other objective) are left
out of the comparison. ``--paper-objective`` places with the planner's own marginal
(the slowdown of sharing free) instead of the fleet's default on several views
(``FleetPlanner.sharing_cost``); ``--objective lifetime`` places by the dollars a
placement adds until its group ends (``rollmux.lifetime``); ``--regroup`` also regroups
after departures (``fleet_exact.plan_fleet_regroup``: ``rollmux-regroup`` and
``rollmux-full-regroup``). ``--hedge`` replays ``rollmux-hedge`` instead (the full space,
every group dominated by its members' Gavel+ options, jobs alone gathered; the other
options are then ignored).

    python benchmarks/fleet_replay.py [--instances 15] [--jobs 12] [--space paper|full] [--seed 1]
                                      [--paper-objective] [--objective rate|lifetime] [--regroup]
                                      [--hedge]
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

from rollmux.errors import CapacityError
from rollmux.fleet_file import load_fleet
from rollmux.planner import FULL_SPACE, PAPER_SPACE
from rollmux.policies.fleet import FLEET_ROLLMUX, FleetRollMux, fleet_policies, fleet_rollmux
from rollmux.sim.engine import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_vs_exact import FLEET, profiles_for  # noqa: E402
from planner_vs_exact import make_jobs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--window-h", type=float, default=4.0)
    ap.add_argument("--space", default="paper", choices=("paper", "full"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--paper-objective", action="store_true")
    ap.add_argument("--objective", default="rate", choices=("rate", "lifetime"))
    ap.add_argument("--regroup", action="store_true")
    ap.add_argument("--hedge", action="store_true", help="replay rollmux-hedge")
    args = ap.parse_args()
    space = FULL_SPACE if args.space == "full" else PAPER_SPACE
    fleet = load_fleet(FLEET)
    rng = random.Random(args.seed)
    ratios, winners = [], Counter()
    print(f"{'instance':>8} {'rollmux $':>10} {'SLO':>6} {'cheapest other':<24} {'its $':>8} {'ratio':>6}")
    for i in range(args.instances):
        jobs = [dataclasses.replace(j, arrival_s=float(rng.randint(0, int(args.window_h * 3600))),
                                    duration_s=float(rng.randint(5, 20) * 3600))
                for j in make_jobs(rng, args.jobs, "mixed")]
        profiles = profiles_for(rng, jobs)
        # ours: the fleet planner in the chosen space and objective; the other RollMux rows are left out
        others = [p for p in fleet_policies(fleet, profiles) if p.name not in FLEET_ROLLMUX]
        ours_policy = fleet_rollmux(fleet, profiles, "rollmux-hedge") if args.hedge else FleetRollMux(
            fleet, profiles, space, sharing_cost=False if args.paper_objective else None, objective=args.objective,
            regroup=args.regroup)
        policies = [ours_policy] + others
        results = []
        for policy in policies:
            try:
                results.append(simulate(jobs, fleet.views()[0].cluster, policy))
            except CapacityError:  # a view that serves no job
                continue
        ours = results[0]
        best = min((r for r in results[1:] if r.slo_attainment >= ours.slo_attainment), key=lambda r: r.total_cost)
        ratios.append(ours.total_cost / best.total_cost)
        if ratios[-1] > 1:
            winners[best.policy] += 1
        print(f"{i:>8} {ours.total_cost:>10,.0f} {100 * ours.slo_attainment:>5.1f}% {best.policy:<24} "
              f"{best.total_cost:>8,.0f} {ratios[-1]:>6.3f}")
    print(f"rollmux / cheapest other: mean {statistics.fmean(ratios):.3f}, worst {max(ratios):.3f}, "
          f"best {min(ratios):.3f}; rollmux lost {sum(r > 1 for r in ratios)} of {len(ratios)}"
          + (f" (to {', '.join(f'{k} x{v}' for k, v in winners.most_common())})" if winners else ""))


if __name__ == "__main__":
    main()
