"""Would holding a job back find it a partner? An oracle replay, not a policy.

The jobs that ``--policy`` (default ``rollmux-hedge``) places alone on arrival
(co-located, or in a new group) are made to arrive later by a share ``f`` of their
end-to-end slack, (SLO - 1) x their solo run, and the trace is replayed. The bill is
reported over the original trace's span, and each job's end-to-end slowdown is taken
from its real arrival, so the wait counts against its SLO. The oracle knows which jobs
end up alone, which no online queue would; if it saves little, a deferral policy saves
less (docs/placement_space.md, "Production at $540/h").

    python benchmarks/delay_oracle.py [--trace production] [--policy rollmux-hedge] [--shares 0.25,0.5]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.sim.metrics import SLO_TOLERANCE
from rollmux.traces.builtin import load_trace

ALONE = ("co-located", "new-group")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="production")
    ap.add_argument("--policy", default="rollmux-hedge")
    ap.add_argument("--shares", default="0.25,0.5", help="shares f of each delayed job's end-to-end slack")
    args = ap.parse_args()
    cluster = Cluster()
    jobs, _ = load_trace(args.trace, cluster)
    base = simulate(jobs, cluster, make_policy(args.policy, cluster=cluster))
    hours = base.reference_span_s / 3600
    alone = {o.job_id for o in base.jobs if o.outcome in ALONE}
    arrival = {j.job_id: j.arrival_s for j in jobs}
    slo = {j.job_id: j.slo for j in jobs}
    print(f"{args.policy} on {args.trace}: ${base.cost_per_hour:,.1f}/h, {len(alone)} of {len(jobs)} jobs placed alone "
          "on arrival")
    print(f"{'f':>5} {'$/h':>8} {'SLO met end to end':>19} {'SLO met per iteration':>22}")
    for f in (float(x) for x in args.shares.split(",")):
        moved = [replace(j, arrival_s=j.arrival_s + f * (j.slo - 1.0) * j.solo_run_s(j.solo_iterations()))
                 if j.job_id in alone else j for j in jobs]
        run = simulate(moved, cluster, make_policy(args.policy, cluster=cluster))
        met = sum((o.end_s - arrival[o.job_id]) / o.solo_s <= slo[o.job_id] * (1 + SLO_TOLERANCE) for o in run.jobs)
        print(f"{f:>5.2f} {run.total_cost / hours:>8.1f} {f'{met}/{len(jobs)}':>19} "
              f"{100 * run.slo_attainment:>21.1f}%")


if __name__ == "__main__":
    main()
