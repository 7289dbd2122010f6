"""Long-tail migration in the simulator: hand-offs on vs off under the same draws.

    .venv/bin/python benchmarks/long_tail.py --trace production --policies rollmux

Both runs use ``simulate(..., tail=True)`` (per-job draw streams, heads drawn), one with
``handoff=False``: every phase draws the same figures, so the difference is the hand-off.
A job's rate is iterations / (end - placement), in iterations per hour. "Shared groups":
the groups (by final id, hand-off off) that ended with two or more jobs; the gain is each
of their jobs' rate with hand-offs over its rate without, averaged (same job both runs).
Also cost ($/h over the trace's solo span, total $), SLO attainment, the mean
per-iteration slowdown of all jobs, rollout-pool utilization (a hand-off slice's tail
counts as busy: docs/long_tail.md) and the hand-offs made.
One Markdown table, two rows per policy.
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from bounded_regroup import policy_names
from rollmux.cluster_file import load_cluster
from rollmux.errors import SpecError
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace


def rates(result):
    """Job -> (iterations/hour from placement to end, group id at the end)."""
    return {o.job_id: (o.iterations / max(o.end_s - o.placed_s, 1e-9) * 3600, o.group_id) for o in result.jobs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="production", help="a built-in trace or a trace file")
    ap.add_argument("--policies", default="rollmux", help="policy names, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = policy_names(ap, args.policies)
    cl = load_cluster(None)
    try:
        jobs, info = load_trace(args.trace, cl, args.seed)
    except SpecError as err:
        ap.error(f"--trace: {err}")
    print(f"trace {info['name']}: {len(jobs)} jobs")
    print("| policy | hand-off | $/h | total $ | SLO met | mean iter/solo | rollout util | shared groups (jobs) | "
          "mean iters/h of those jobs | per-job rate vs off | hand-offs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        res = {}
        for handoff in (False, True):
            res[handoff] = simulate(jobs, cl, make_policy(name, args.seed), "stochastic", args.seed,
                                    tail=True, handoff=handoff)
        base = rates(res[False])
        size = defaultdict(int)
        for _, g in base.values():
            size[g] += 1
        shared = [k for k, (_, g) in base.items() if size[g] >= 2]  # jobs whose group had company
        groups = {base[k][1] for k in shared}
        for handoff in (False, True):
            r = res[handoff]
            s = r.summary()
            now = rates(r)
            gains = [now[k][0] / base[k][0] for k in shared if k in now]
            slow = statistics.mean((o.end_s - o.placed_s) / o.iterations / o.t_solo for o in r.jobs)
            print(f"| {name} | {'on' if handoff else 'off'} | {s['cost_per_hour']:.2f} | {s['total_cost']:,.0f} | "
                  f"{s['slo_attainment'] * 100:.1f}% | {slow:.4f} | {s['rollout_utilization'] * 100:.1f}% | "
                  f"{len(groups)} ({len(shared)} jobs) | "
                  f"{statistics.mean(now[k][0] for k in shared):.3f} | "
                  f"{statistics.mean(gains):.4f}x (min {min(gains):.3f}, max {max(gains):.3f}) | "
                  f"{r.outcomes.get('hand-offs', 0):,} |", flush=True)


if __name__ == "__main__":
    main()
