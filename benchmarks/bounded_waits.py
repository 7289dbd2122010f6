"""Fixed clusters where jobs queue: `rollmux-hedge` regrouping the jobs alone when the
waiting line's head is refused, against the same policy without it and `rollmux-regroup`.

`rollmux-hedge` starts most jobs alone on their own nodes (co-located on their training
GPUs) and gathers them into groups later. On a fixed cluster those jobs hold nodes of the
pool the waiting line needs. With ``regroup_on_wait`` (as shipped) every refusal of the
line's head offers each job alone a gathering (``rollmux.sim.engine``), which gives nodes
back. Each configuration replays the first J jobs of a built-in trace on R H20 and T H800
nodes (worst-case durations, our accounting; SLOs judged end to end, wait included), in
one process, every policy on the same jobs. The last lines are the means over the
configurations and, for the shipped policy, on how many it met more / fewer SLOs than
without the trigger.

    python benchmarks/bounded_waits.py [--configs production:24x16:200,philly-mix:20x14:400]
"""
from __future__ import annotations

import argparse
import statistics

from bounded_regroup import fixed_cluster, timed
from rollmux.policies import make_policy
from rollmux.traces.builtin import load_trace

CONFIGS = ("production:12x10:40,production:16x14:60,production:12x8:200,production:16x12:200,"
           "production:20x12:200,production:20x16:200,production:24x16:200,production:28x20:200,"
           "production:24x20:100,philly-mix:12x8:400,philly-mix:16x12:400,philly-mix:20x14:400,"
           "philly-mix:24x16:400,philly-mix:28x20:400,philly-mix:20x20:400")
#: (label, policy name, regroup_on_wait or None to leave the policy as made)
VARIANTS = (("hedge", "rollmux-hedge", None), ("hedge, no wait trigger", "rollmux-hedge", False),
            ("rollmux-regroup", "rollmux-regroup", None))


def replay(trace: str, spec: str, name: str, on_wait: bool | None):
    nodes, count = spec.split(":")
    cluster = fixed_cluster(*(int(x) for x in nodes.split("x")))
    jobs = load_trace(trace, cluster)[0][: int(count)]
    policy = make_policy(name, cluster=cluster)
    if on_wait is not None:
        policy.regroup_on_wait = on_wait
    return timed(jobs, cluster, policy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=CONFIGS,
                        help="TRACE:RxT:J, comma-separated: a built-in trace, R H20 and T H800 nodes, its first J jobs")
    args = parser.parse_args()
    configs = [c.split(":", 1) for c in args.configs.split(",")]
    rows: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in VARIANTS}
    print(f"{'trace':>11} {'cluster':>12} {'policy':>24} {'$/h':>7} {'SLO e2e':>8} {'wait h':>7} "
          f"{'regroupings':>12} {'wall s':>7}")
    for trace, spec in configs:
        for label, name, on_wait in VARIANTS:
            result, wall = replay(trace, spec, name, on_wait)
            rows[label].append((result.cost_per_hour, result.slo_attainment))
            print(f"{trace:>11} {spec:>12} {label:>24} {result.cost_per_hour:>7.1f} {result.slo_attainment:>8.1%} "
                  f"{result.summary()['mean_wait_s'] / 3600:>7.1f} {result.outcomes.get('regroupings', 0):>12} "
                  f"{wall:>7.1f}", flush=True)
    print()
    for label, got in rows.items():
        print(f"{label:>24}: mean $/h {statistics.fmean(c for c, _ in got):.1f}, "
              f"mean SLO met {statistics.fmean(s for _, s in got):.2%} over {len(got)} configurations")
    shipped, before = rows["hedge"], rows["hedge, no wait trigger"]
    more = sum(a[1] > b[1] + 1e-9 for a, b in zip(shipped, before))
    fewer = sum(a[1] < b[1] - 1e-9 for a, b in zip(shipped, before))
    print(f"hedge against no wait trigger: more SLOs met on {more}, fewer on {fewer}, "
          f"the same on {len(shipped) - more - fewer}")


if __name__ == "__main__":
    main()
