"""What each of the paper's modelling choices is worth, one at a time.

Runs a policy on a builtin trace under ``--accounting paper`` and then with each of
its switches (``rollmux.accounting.CostAccounting``) turned back to ours, one at a
time, and under ours; prints $/h (the authors' unit converted: units x $42.24 / 3600
over the run's hours) and SLO attainment. See docs/reproduce.md.

    python benchmarks/paper_accounting.py [--trace production] [--policy rollmux]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from rollmux.accounting import OURS, PAPER
from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace

SWITCHES = ("fixed_departures", "switch_cost", "host_memory_limit", "one_node_per_pool", "saturation_gate",
            "whole_run_slo_checks", "rollout_price_ratio")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="production")
    ap.add_argument("--policy", default="rollmux")
    args = ap.parse_args()
    variants = [("paper", PAPER)]
    variants += [(f"paper, {name} as ours", replace(PAPER, **{name: getattr(OURS, name)})) for name in SWITCHES]
    variants += [("paper, equal widths and equal work",
                  replace(PAPER, fixed_departures=False, one_node_per_pool=False)), ("ours", OURS)]
    print(f"trace {args.trace}, policy {args.policy}")
    print(f"{'accounting':<48} {'$/h':>7} {'units':>12} {'SLO met':>8}")
    for label, acct in variants:
        cluster = acct.apply_cluster(Cluster())
        jobs = load_trace(args.trace, cluster, 0)[0]
        r = simulate(jobs, cluster, make_policy(args.policy, 0, acct), accounting=acct)
        print(f"{label:<48} {r.cost_per_hour:>7.1f} {acct.units(r.total_cost, cluster):>12,.0f} "
              f"{r.slo_attainment:>8.1%}")


if __name__ == "__main__":
    main()
