"""Fixed clusters where jobs queue: the regrouping policies that gather their jobs alone
when the waiting line's head is refused, each against itself without it, and
`rollmux-regroup`, which has no such trigger.

`rollmux-hedge` starts most jobs alone on their own nodes (co-located on their training
GPUs) and gathers them into groups later; `rollmux-full-regroup` co-locates a job when
that is its cheapest placement and regroups later. On a fixed cluster those jobs hold
nodes of the pool the waiting line needs. With ``regroup_on_wait`` (as shipped for both)
every refusal of the line's head offers each job alone a regrouping
(``rollmux.sim.engine``), which gives nodes back. Each configuration replays the first J
jobs of a built-in trace on R H20 and T H800 nodes (worst-case durations, our accounting;
SLOs judged end to end, wait included), in one process, every policy on the same jobs.
The last lines are the means over the configurations and, for each policy with the
trigger, on how many configurations it met more / fewer SLOs than without it.
`rollmux-full-regroup` replays take minutes each on 400 jobs (the whole default run
about half an hour on one core).

    python benchmarks/bounded_waits.py [--configs production:24x16:200,philly-mix:20x14:400]
                                       [--policies rollmux-hedge,rollmux-regroup] [--queue backfill|fifo]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bounded_regroup import NODES_AND_JOBS, add_queue_option, fixed_cluster, nodes_and_jobs, policy_names, timed
from rollmux.policies import make_policy
from rollmux.traces.builtin import BUILTIN, load_trace

CONFIGS = ("production:12x10:40,production:16x14:60,production:12x8:200,production:16x12:200,"
           "production:20x12:200,production:20x16:200,production:24x16:200,production:28x20:200,"
           "production:24x20:100,philly-mix:12x8:400,philly-mix:16x12:400,philly-mix:20x14:400,"
           "philly-mix:24x16:400,philly-mix:28x20:400,philly-mix:20x20:400")
POLICIES = "rollmux-hedge,rollmux-full-regroup,rollmux-regroup"
NO_TRIGGER = ", no wait trigger"


def variants(names: list[str]) -> list[tuple[str, str, bool | None]]:
    """(label, policy name, regroup_on_wait or None to leave the policy as made): each
    policy as made and, when it has the trigger, the same policy without it."""
    out: list[tuple[str, str, bool | None]] = []
    for name in names:
        out.append((name, name, None))
        if getattr(make_policy(name, cluster=fixed_cluster(1, 1)), "regroup_on_wait", False):
            out.append((name + NO_TRIGGER, name, False))
    return out


def parse_configs(parser: argparse.ArgumentParser, text: str) -> list[tuple[str, str]]:
    """``--configs`` as (trace, RxT:J) pairs, or the parser's error naming the option."""
    configs = []
    for config in text.split(","):
        trace, _, spec = config.partition(":")
        if trace not in BUILTIN and not Path(trace).is_file():
            parser.error(f"--configs {config!r}: expected TRACE:{NODES_AND_JOBS}, TRACE a built-in trace "
                         f"({', '.join(BUILTIN)}) or a trace file")
        try:
            nodes_and_jobs(spec)
        except ValueError as err:
            parser.error(f"--configs {config!r}: {err}")
        configs.append((trace, spec))
    return configs


def replay(trace: str, spec: str, name: str, on_wait: bool | None, backfill: bool = True):
    rollout, train, count = nodes_and_jobs(spec)
    cluster = fixed_cluster(rollout, train)
    jobs = load_trace(trace, cluster)[0][:count]
    policy = make_policy(name, cluster=cluster)
    if on_wait is not None:
        policy.regroup_on_wait = on_wait
    return timed(jobs, cluster, policy, backfill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=CONFIGS,
                        help="TRACE:RxT:J, comma-separated: a built-in trace, R H20 and T H800 nodes, its first J jobs")
    parser.add_argument("--policies", default=POLICIES, help="policy names, comma-separated")
    add_queue_option(parser)
    args = parser.parse_args()
    configs = parse_configs(parser, args.configs)
    table = variants(policy_names(parser, args.policies))
    rows: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in table}
    width = max(len(label) for label in rows)
    print(f"{'trace':>11} {'cluster':>12} {'policy':>{width}} {'$/h':>7} {'SLO e2e':>8} {'wait h':>7} "
          f"{'regroupings':>12} {'wall s':>7}")
    for trace, spec in configs:
        for label, name, on_wait in table:
            result, wall = replay(trace, spec, name, on_wait, args.queue == "backfill")
            rows[label].append((result.cost_per_hour, result.slo_attainment))
            print(f"{trace:>11} {spec:>12} {label:>{width}} {result.cost_per_hour:>7.1f} "
                  f"{result.slo_attainment:>8.1%} {result.summary()['mean_wait_s'] / 3600:>7.1f} "
                  f"{result.outcomes.get('regroupings', 0):>12} {wall:>7.1f}", flush=True)
    print()
    for label, got in rows.items():
        print(f"{label:>{width}}: mean $/h {statistics.fmean(c for c, _ in got):.1f}, "
              f"mean SLO met {statistics.fmean(s for _, s in got):.2%} over {len(got)} configurations")
    for label in rows:
        if label + NO_TRIGGER not in rows:
            continue
        shipped, before = rows[label], rows[label + NO_TRIGGER]
        more = sum(a[1] > b[1] + 1e-9 for a, b in zip(shipped, before))
        fewer = sum(a[1] < b[1] - 1e-9 for a, b in zip(shipped, before))
        print(f"{label} against no wait trigger: more SLOs met on {more}, fewer on {fewer}, "
              f"the same on {len(shipped) - more - fewer}")


if __name__ == "__main__":
    main()
