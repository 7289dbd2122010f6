"""Which jobs should simply run co-located? A per-type table and a split replay.

For every job type of a trace (model, GPUs, phase profile), the price of one iteration
co-located alone on its training nodes (``rollmux.colocation``: both phases there, each
with its switch) against one iteration solo on its own disaggregated nodes, and the
co-located slowdown. Where co-location is cheap and faster than solo, a job needs no
partner at all, so it never waits alone in a group.

Then the split policy: co-locate up front every job whose co-located run costs at most
``x`` times its solo run and meets its SLO, and run the others under ``--policy`` (by
default ``rollmux-regroup``); the bill is the co-located jobs' node time plus that
replay's, over the trace's span, for each ``x`` in ``--thresholds``, beside the policy
on the whole trace. "SLO met" is over the whole trace: the co-located jobs (each meets
its SLO) and the replayed others' attainment. It asks whether RollMux leaves money with
the jobs that co-locate well; on the production trace it does not
(docs/placement_space.md, "Production at $540/h").

    python benchmarks/colocation_split.py [--trace production] [--policy rollmux-regroup]
                                          [--thresholds 0.6,0.65,0.7,0.8]
"""
from __future__ import annotations

import argparse
from collections import defaultdict

from rollmux import colocation
from rollmux.errors import SpecError
from rollmux.model import Cluster, Job
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace


def run_cost(job: Job, cluster: Cluster, colocated: bool) -> float:
    """$ of node time for ``job``'s whole run alone: co-located, or solo disaggregated."""
    return job.solo_iterations() * colocation.iteration_price(job, cluster, colocated) / 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="production")
    ap.add_argument("--policy", default="rollmux-regroup")
    ap.add_argument("--thresholds", default="0.6,0.65,0.7,0.8",
                    help="co-locate a job when its co-located run costs at most this times its solo run")
    args = ap.parse_args()
    try:
        thresholds = [float(v) for v in args.thresholds.split(",")]
        valid = all(x >= 0 for x in thresholds)
    except ValueError:
        valid = False
    if not valid:
        ap.error(f"--thresholds {args.thresholds!r}: expected comma-separated numbers >= 0, e.g. 0.6,0.7")
    try:
        make_policy(args.policy)
    except ValueError as err:
        ap.error(f"--policy: {err}")
    cluster = Cluster()
    try:
        jobs, _ = load_trace(args.trace, cluster)
    except SpecError as err:
        ap.error(f"--trace: {err}")
    types: dict[tuple, list[Job]] = defaultdict(list)
    for j in jobs:
        types[(j.model, j.rollout_gpus, j.train_gpus, j.t_roll_s, j.t_train_s)].append(j)
    print(f"{'type':<28} {'jobs':>4} {'co-located / solo $':>20} {'co-located slowdown':>20} {'SLO below it':>12}")
    for (model, rg, tg, r, t), members in sorted(types.items(), key=lambda kv: -len(kv[1])):
        j = members[0]
        ratio = run_cost(j, cluster, True) / run_cost(j, cluster, False)
        slow = colocation.slowdown(j, cluster)
        below = sum(m.slo < slow for m in members)
        print(f"{f'{model} {rg}+{tg} R {r:g} T {t:g}':<28} {len(members):>4} {ratio:>20.2f} {slow:>20.2f} {below:>12}")
    whole = simulate(jobs, cluster, make_policy(args.policy))
    hours = whole.reference_span_s / 3600
    print(f"\n{args.policy} on the whole trace: ${whole.cost_per_hour:,.1f}/h, SLO met {100 * whole.slo_attainment:.1f}%")
    print(f"{'x':>5} {'co-located':>10} {'their $':>10} {'others':>7} {'replay $':>10} {'SLO met':>8} {'$/h':>8}")
    for x in thresholds:
        colo = [j for j in jobs if colocation.slowdown(j, cluster) <= j.slo
                and run_cost(j, cluster, True) <= x * run_cost(j, cluster, False)]
        ids = {j.job_id for j in colo}
        rest = [j for j in jobs if j.job_id not in ids]
        colo_cost = sum(run_cost(j, cluster, True) for j in colo)
        replay = simulate(rest, cluster, make_policy(args.policy)) if rest else None
        rest_cost = replay.used_cost if replay else 0.0
        met = (len(colo) + (replay.slo_attainment * len(rest) if replay else 0.0)) / len(jobs)
        print(f"{x:>5.2f} {len(colo):>10} {colo_cost:>10,.0f} {len(rest):>7} {rest_cost:>10,.0f} {100 * met:>7.1f}% "
              f"{(colo_cost + rest_cost) / hours:>8.1f}")


if __name__ == "__main__":
    main()
