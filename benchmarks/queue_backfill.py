"""Fixed clusters where jobs queue: the waiting line backfilled by packing (as shipped)
against strictly first come, first placed, each policy on the same jobs.

Backfilled, a job behind the line's head (or an arrival while the line is not empty) is
placed at once when the policy packs it into a running group on that group's own
nodes (``rollmux.sim.engine``, ``backfill=True``): it takes no free node, though it may
keep its group's nodes busy for longer, and so delay a head that waits for them. Each
configuration replays the first J jobs of a built-in trace on R H20 and T H800 nodes
(worst-case durations, our accounting; SLOs judged end to end, wait included). Per row:
$/h, SLOs met end to end, mean wait, how many jobs passed the line and, backfilled, how
many jobs started earlier / later than strictly in order (the price of passing: jobs
that waited longer). The last lines are, per policy, the means over the configurations
in each order and on how many configurations backfilling met more / fewer SLOs.

    python benchmarks/queue_backfill.py [--configs production:24x16:200,philly-mix:20x14:400]
                                        [--policies rollmux,rollmux-regroup]
"""
from __future__ import annotations

import argparse
import statistics

from bounded_regroup import policy_names
from bounded_waits import CONFIGS, parse_configs, replay

POLICIES = "rollmux,rollmux-consolidate,rollmux-regroup,rollmux-hedge"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=CONFIGS,
                        help="TRACE:RxT:J, comma-separated: a built-in trace, R H20 and T H800 nodes, its first J jobs")
    parser.add_argument("--policies", default=POLICIES, help="policy names, comma-separated")
    args = parser.parse_args()
    configs = parse_configs(parser, args.configs)
    names = policy_names(parser, args.policies)
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    width = max(len(n) for n in names)
    print(f"{'trace':>11} {'cluster':>12} {'policy':>{width}} {'queue':>9} {'$/h':>7} {'SLO e2e':>8} {'wait h':>7} "
          f"{'passed':>7} {'earlier':>8} {'later':>6} {'wall s':>7}")
    for trace, spec in configs:
        for name in names:
            started: dict[str, float] = {}
            for queue in ("fifo", "backfill"):
                result, wall = replay(trace, spec, name, None, queue == "backfill")
                rows.setdefault((name, queue), []).append((result.cost_per_hour, result.slo_attainment))
                earlier = later = "-"
                if queue == "fifo":
                    started = {o.job_id: o.placed_s for o in result.jobs}
                else:  # a job that never ran in one order counts as starting at infinity there
                    mine = {o.job_id: o.placed_s for o in result.jobs}
                    ids = set(started) | set(mine)
                    inf = float("inf")
                    earlier = sum(mine.get(j, inf) < started.get(j, inf) - 1e-6 for j in ids)
                    later = sum(mine.get(j, inf) > started.get(j, inf) + 1e-6 for j in ids)
                print(f"{trace:>11} {spec:>12} {name:>{width}} {queue:>9} {result.cost_per_hour:>7.1f} "
                      f"{result.slo_attainment:>8.1%} {result.summary()['mean_wait_s'] / 3600:>7.1f} "
                      f"{result.outcomes.get('backfilled', 0):>7} {earlier:>8} {later:>6} {wall:>7.1f}", flush=True)
    print()
    for name in names:
        fifo, backfill = rows[(name, "fifo")], rows[(name, "backfill")]
        more = sum(b[1] > f[1] + 1e-9 for f, b in zip(fifo, backfill))
        fewer = sum(b[1] < f[1] - 1e-9 for f, b in zip(fifo, backfill))
        print(f"{name:>{width}}: fifo mean $/h {statistics.fmean(c for c, _ in fifo):.1f}, "
              f"SLO met {statistics.fmean(s for _, s in fifo):.2%}; backfill mean $/h "
              f"{statistics.fmean(c for c, _ in backfill):.1f}, SLO met {statistics.fmean(s for _, s in backfill):.2%}; "
              f"backfill met more SLOs on {more}, fewer on {fewer}, the same on {len(fifo) - more - fewer}")


if __name__ == "__main__":
    main()
