"""How efficient can a group of identical jobs be? A ceiling check for a trace's job types.

For each job type of a trace (its ``model`` column and widths), every group of k
identical members (k = 1 .. max group size) on r rollout and t training node blocks
(r, t <= k; a block is one member's nodes in that pool; members pinned round-robin:
member i on rollout block i mod r and training block i mod t) is analysed with
``rollmux.intra.analyze`` (worst-case phases, the cluster's switch seconds, the
execution rule). Printed per shape, the best four:

* ``slowdown``: the slowest member's steady iteration / its solo iteration;
* ``$/solo-h``: what one member's work costs per hour it would take alone,
  (r n_R price_R + t n_T price_T) / k x slowdown: the group's nodes are held that much
  longer per unit of work (this project's accounting);
* ``efficiency``: the busy floor (each phase's node-seconds at its pool's price, per
  solo hour: what a job costs with no idle node) over ``$/solo-h``. ``colo`` is the job
  co-located alone on its training nodes (the trace's co-located timings), when it has them.

A type's best shape within an SLO bounds nothing across types (mixed groups can do
better), but it shows how far the group model is from the busy floor for the jobs that
dominate a trace. ``--max-slowdown`` keeps only the shapes within that slowdown.

``--bill`` adds what the whole trace would cost if every job ran its whole run in the
best such shape its own SLO allows (or co-located alone, when that is better and meets
its SLO): the work of the trace (``rollmux.waste``: each job's solo iterations at node
prices) over each job's best efficiency, per hour of the trace's solo span. It is the
bill of a plan in which every job always had the ideal company of its own kind: not a
bound either, but a yardstick for the waste that partners arriving and leaving at other
times cost.

    python benchmarks/group_efficiency.py [--trace production] [--types 7B_8k,8B_32k]
                                          [--max-slowdown 2.0] [--bill]
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from rollmux import colocation
from rollmux.errors import RollMuxError
from rollmux.intra import MemberProfile, analyze
from rollmux.model import ROLLOUT, TRAIN, Cluster, Job
from rollmux.sim.metrics import solo_span_s
from rollmux.traces.builtin import load_trace
from rollmux.waste import iteration_value


def shapes(max_size: int):
    for k in range(1, max_size + 1):
        for r in range(1, k + 1):
            for t in range(1, k + 1):
                yield k, r, t


def shape_rows(job: Job, cluster: Cluster, max_slowdown: float) -> list[tuple[float, str, float, float]]:
    """(efficiency, shape, slowdown, $/solo-h) of every shape of identical ``job`` members
    within ``max_slowdown``, and of ``job`` co-located alone when the trace times it."""
    gpn = cluster.gpus_per_node
    n_r, n_t = job.nodes(ROLLOUT, gpn), job.nodes(TRAIN, gpn)
    price = {p: cluster.node_price(p) for p in (ROLLOUT, TRAIN)}
    sw_r, sw_t = (cluster.switch_cost.seconds(job.model, p) for p in (ROLLOUT, TRAIN))
    floor = iteration_value(job, cluster) / job.t_solo
    rows = []
    for k, r, t in shapes(cluster.max_group_size):
        members = [MemberProfile(f"m{i}", job.t_roll_s, job.t_train_s,
                                 tuple(f"R{(i % r) * n_r + x}" for x in range(n_r)),
                                 tuple(f"T{(i % t) * n_t + x}" for x in range(n_t)), sw_r, sw_t) for i in range(k)]
        slowdown = max(analyze(members).slowdown.values())
        if slowdown <= max_slowdown + 1e-9:
            cost = (r * n_r * price[ROLLOUT] + t * n_t * price[TRAIN]) / k * slowdown
            rows.append((floor / cost, f"{k}/{r}/{t}", slowdown, cost))
    try:
        slowdown = colocation.iteration_s(job, cluster) / job.t_solo
    except RollMuxError:  # no co-located timings for this job
        return rows
    if slowdown <= max_slowdown + 1e-9:
        cost = n_t * price[TRAIN] * slowdown
        rows.append((floor / cost, "colo", slowdown, cost))
    return rows


def _best_first(row: tuple[float, str, float, float]) -> tuple[float, int]:
    """Sort key: higher efficiency first, then fewer members (2/1/1 before its copy 4/2/2)."""
    return -round(row[0], 9), 1 if row[1] == "colo" else int(row[1].split("/")[0])


def partnered(jobs: list[Job], cluster: Cluster) -> dict[str, tuple[float, float, Counter]]:
    """Per type: (work $, all-partnered $, jobs per best shape): every job for its whole
    run in the best shape its own SLO allows (``--bill``)."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0.0, Counter()])
    best: dict[tuple, tuple[float, str]] = {}
    for job in jobs:
        key = (job.model, job.t_roll_s, job.t_train_s, job.rollout_gpus, job.train_gpus, job.slo)
        if key not in best:
            best[key] = min(shape_rows(job, cluster, job.slo), key=_best_first)[:2]
        eff, shape = best[key]
        entry = out[job.model]
        work = job.solo_iterations() * iteration_value(job, cluster) / 3600.0
        entry[0] += work
        entry[1] += work / eff
        entry[2][shape] += 1
    return {model: tuple(entry) for model, entry in out.items()}


def bill(jobs: list[Job], cluster: Cluster) -> None:
    """Print the all-partnered bill (``--bill``) and its make-up per type."""
    per_type = partnered(jobs, cluster)
    hours = solo_span_s(jobs) / 3600.0
    total_w, total_c = (sum(v[i] for v in per_type.values()) for i in (0, 1))
    print(f"\nevery job in its best shape within its own SLO for its whole run: ${total_c:,.0f} "
          f"= ${total_c / hours:,.1f}/h over {hours:,.1f} h; work ${total_w:,.0f} (${total_w / hours:,.1f}/h), "
          f"efficiency {100 * total_w / total_c:.1f}%")
    print(f"{'type':<10} {'work $':>9} {'cost $':>9} {'efficiency':>10}  shapes (k/r/t or colo: jobs)")
    for model, (work, cost, used) in sorted(per_type.items(), key=lambda kv: -kv[1][1]):
        shapes_used = ", ".join(f"{s}: {n}" for s, n in used.most_common())
        print(f"{model:<10} {work:>9,.0f} {cost:>9,.0f} {100 * work / cost:>9.1f}%  {shapes_used}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="production")
    ap.add_argument("--types", default="", help="comma list of models (default: every type, most jobs first)")
    ap.add_argument("--max-slowdown", type=float, default=2.0)
    ap.add_argument("--bill", action="store_true", help="also print the all-partnered bill of the whole trace")
    args = ap.parse_args()
    jobs, _ = load_trace(args.trace)
    cluster = Cluster()
    price = {p: cluster.node_price(p) for p in (ROLLOUT, TRAIN)}
    counts = Counter(j.model for j in jobs)
    wanted = [t for t in args.types.split(",") if t] or [m for m, _ in counts.most_common()]
    print(f"trace {args.trace}: {len(jobs)} jobs; node prices: rollout ${price[ROLLOUT]:.2f}/h, "
          f"training ${price[TRAIN]:.2f}/h")
    print(f"{'type':<10} {'jobs':>4} {'k/r/t':>7} {'slowdown':>9} {'$/solo-h':>9} {'efficiency':>10}")
    for model in wanted:
        job = next((j for j in jobs if j.model == model), None)
        if job is None:
            raise SystemExit(f"--types: no job of type {model!r} in {args.trace}")
        for eff, shape, slowdown, cost in sorted(shape_rows(job, cluster, args.max_slowdown), key=_best_first)[:4]:
            print(f"{model:<10} {counts[model]:>4} {shape:>7} {slowdown:>9.3f} {cost:>9.2f} {100 * eff:>9.1f}%")
    if args.bill:
        bill(jobs, cluster)


if __name__ == "__main__":
    main()
