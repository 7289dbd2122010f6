"""How efficient can a group of identical jobs be? A ceiling check for a trace's job types.

For each job type of a trace (its ``model`` column; one node per pool only), every group
of k identical members (k = 1 .. max group size) on r rollout nodes and t training nodes
(r, t <= k; members pinned round-robin: member i on rollout node i mod r and training
node i mod t) is analysed with ``rollmux.intra.analyze`` (worst-case phases, the
cluster's switch seconds, the execution rule). Printed per shape:

* ``slowdown``: the slowest member's steady iteration / its solo iteration;
* ``$/solo-h``: what one member's work costs per hour it would take alone,
  (r price_R + t price_T) / k x slowdown: the group's nodes are held that much longer
  per unit of work (this project's accounting);
* ``efficiency``: the busy floor (each phase's node-seconds at its pool's price, per
  solo hour: what a job costs with no idle node) over ``$/solo-h``.

A type's best shape within an SLO bounds nothing across types (mixed groups can do
better), but it shows how far the group model is from the busy floor for the jobs that
dominate a trace. ``--max-slowdown`` keeps only the shapes within that slowdown.

    python benchmarks/group_efficiency.py [--trace production] [--types 7B_8k,8B_32k]
                                          [--max-slowdown 2.0]
"""
from __future__ import annotations

import argparse
from collections import Counter

from rollmux.intra import MemberProfile, analyze
from rollmux.model import ROLLOUT, TRAIN, Cluster
from rollmux.traces.builtin import load_trace


def shapes(max_size: int):
    for k in range(1, max_size + 1):
        for r in range(1, k + 1):
            for t in range(1, k + 1):
                yield k, r, t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="production")
    ap.add_argument("--types", default="", help="comma list of models (default: every one-node type, most jobs first)")
    ap.add_argument("--max-slowdown", type=float, default=2.0)
    args = ap.parse_args()
    jobs, _ = load_trace(args.trace)
    cluster = Cluster()
    gpn = cluster.gpus_per_node
    price = {p: cluster.node_price(p) for p in (ROLLOUT, TRAIN)}
    one_node = [j for j in jobs if j.nodes(ROLLOUT, gpn) == 1 and j.nodes(TRAIN, gpn) == 1]
    counts = Counter(j.model for j in one_node)
    wanted = [t for t in args.types.split(",") if t] or [m for m, _ in counts.most_common()]
    print(f"trace {args.trace}: {len(jobs)} jobs; node prices: rollout ${price[ROLLOUT]:.2f}/h, "
          f"training ${price[TRAIN]:.2f}/h")
    print(f"{'type':<10} {'jobs':>4} {'k':>2} {'r':>2} {'t':>2} {'slowdown':>9} {'$/solo-h':>9} {'floor':>7} "
          f"{'efficiency':>10}")
    for model in wanted:
        job = next((j for j in one_node if j.model == model), None)
        if job is None:
            raise SystemExit(f"--types: no one-node job of type {model!r} in {args.trace}")
        sw_r, sw_t = (cluster.switch_cost.seconds(job.model, p) for p in (ROLLOUT, TRAIN))
        floor = (job.t_roll_s * price[ROLLOUT] + job.t_train_s * price[TRAIN]) / job.t_solo
        rows = []
        for k, r, t in shapes(cluster.max_group_size):
            members = [MemberProfile(f"m{i}", job.t_roll_s, job.t_train_s, (f"R{i % r}",), (f"T{i % t}",), sw_r, sw_t)
                       for i in range(k)]
            slowdown = max(analyze(members).slowdown.values())
            if slowdown > args.max_slowdown:
                continue
            cost = (r * price[ROLLOUT] + t * price[TRAIN]) / k * slowdown
            rows.append((floor / cost, k, r, t, slowdown, cost))
        for eff, k, r, t, slowdown, cost in sorted(rows, reverse=True)[:4]:
            print(f"{model:<10} {counts[model]:>4} {k:>2} {r:>2} {t:>2} {slowdown:>9.3f} {cost:>9.2f} {floor:>7.2f} "
                  f"{100 * eff:>9.1f}%")


if __name__ == "__main__":
    main()
