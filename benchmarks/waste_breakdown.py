"""Where a policy's bill goes: the work its jobs got done, and the waste, by kind of group.

A replay's node cost is the price of the node time its jobs' iterations need at solo
speed (sum_j I_j b_j / 3600, fixed by the trace) plus the integral of the waste rate W
(``rollmux.waste``). This replays one policy on one trace, integrates each group's $/h
and its members' work rates between plan changes (``waste.WasteLedger``), and prints:

* the bill: node $, the work $ (fixed), the waste, and the $/h a given waste would need;
* the waste by group size, then the ``--top`` group shapes (members' models, rollout and
  training nodes, co-located or not) that waste most, each with its hours and the share
  of its cost that bought work;
* the groups of one job by that job's SLO (to 0.1): whether the jobs left alone are the
  ones whose SLO allows no sharing;
* with ``--by-type``, each job type's share of the node $ (a group's $/h split among its
  members by their work rates), its work, and what it would cost all-partnered (every
  job of the type in its best identical-type shape within its own SLO for its whole run,
  ``group_efficiency.py --bill``): which types the company that is not there costs most.

The ledger counts work at analysed iteration times; what it misses (transients after
each change, the pauses of moves) is printed as its difference from the fixed work.

    python benchmarks/waste_breakdown.py [--trace production] [--policy rollmux-regroup]
                                         [--duration-model worst] [--top 8] [--target 540] [--by-type]
"""
from __future__ import annotations

import argparse
from collections import defaultdict

from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace
from rollmux.waste import WasteLedger, group_shape, iteration_value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="production")
    ap.add_argument("--policy", default="rollmux-regroup")
    ap.add_argument("--duration-model", default="worst", choices=("worst", "stochastic"))
    ap.add_argument("--top", type=int, default=8, help="group shapes to list")
    ap.add_argument("--target", type=float, default=None, help="a $/h to compare with (how much waste it allows)")
    ap.add_argument("--by-type", action="store_true", help="each job type's share of the bill against all-partnered")
    args = ap.parse_args()
    jobs, _ = load_trace(args.trace)
    cluster = Cluster()
    ledger = WasteLedger(key=lambda state, gid: (group_shape(state, gid), alone_slo(state, gid)))
    types = TypeLedger()

    def observe(now, state):
        # a fleet-backed policy (rollmux-hedge) plans on the cluster as a fleet of one view: its plan
        plan = next(iter(state.views.values()))[1] if hasattr(state, "views") else state
        ledger.observe(now, plan)
        types.observe(now, plan)

    result = simulate(jobs, cluster, make_policy(args.policy, cluster=cluster), duration_model=args.duration_model,
                      on_change=observe)
    node = result.used_cost - result.reward_cost
    by_id = {j.job_id: j for j in jobs}
    work = sum(o.iterations * iteration_value(by_id[o.job_id], cluster) for o in result.jobs) / 3600
    hours = result.reference_span_s / 3600  # the hours $/h is counted over (the trace's solo span)
    ledger_cost, ledger_work = ledger.totals()
    print(f"{args.policy} on {args.trace} ({args.duration_model}): ${result.cost_per_hour:,.1f}/h over {hours:,.1f} h, "
          f"SLO met {100 * result.slo_attainment:.1f}%")
    print(f"node $ {node:,.0f} = work $ {work:,.0f} ({100 * work / node:.1f}%, ${work / hours:,.1f}/h) "
          f"+ waste $ {node - work:,.0f} ({100 * (node - work) / node:.1f}%)")
    print(f"ledger: node $ {ledger_cost:,.0f}, work $ {ledger_work:,.0f} at analysed iteration times "
          f"(transients and pauses: ${ledger_work - work:,.0f})")
    if args.target is not None:
        allowed = args.target * hours - work
        print(f"${args.target:,.1f}/h allows waste $ {allowed:,.0f}: {100 * (1 - allowed / (node - work)):.1f}% less")
    shapes = summed(ledger, lambda key: key[0])
    print(f"\n{'groups':<44} {'hours':>8} {'waste $':>10} {'work/cost':>10}")
    for size, (h, cost, got) in sorted(summed(ledger, lambda key: key[0][0]).items()):
        label = f"of {size} job" + ("s" if size > 1 else "")
        print(f"{label:<44} {h:>8,.0f} {cost - got:>10,.0f} {100 * got / cost:>9.1f}%")
    print(f"\n{'shape (models / rollout / training nodes)':<44} {'hours':>8} {'waste $':>10} {'work/cost':>10}")
    ranked = sorted(shapes.items(), key=lambda kv: -(kv[1][1] - kv[1][2]))
    for (size, models, n_r, n_t, colocated), (h, cost, got) in ranked[:args.top]:
        shape = f"{' + '.join(models)} / {n_r} / {n_t}" + (" co-located" if colocated else "")
        print(f"{shape:<44} {h:>8,.0f} {cost - got:>10,.0f} {100 * got / cost:>9.1f}%")
    print(f"\n{'jobs alone in a group, by SLO':<44} {'hours':>8} {'waste $':>10} {'work/cost':>10}")
    for slo, (h, cost, got) in sorted(summed(ledger, lambda key: key[1]).items(), key=lambda kv: kv[0] or 0):
        if slo is not None:
            print(f"{slo:<44.1f} {h:>8,.0f} {cost - got:>10,.0f} {100 * got / cost:>9.1f}%")
    if args.by_type:
        from group_efficiency import partnered

        ideal = partnered(jobs, cluster)
        print(f"\n{'job type (group $ split by work rate)':<44} {'node $':>8} {'work $':>8} "
              f"{'work/cost':>10} {'partnered $':>12} {'excess $':>9}")
        for model, (cost, got) in sorted(types.by_type.items(), key=lambda kv: -(kv[1][0] - ideal[kv[0]][1])):
            print(f"{model:<44} {cost:>8,.0f} {got:>8,.0f} {100 * got / cost:>9.1f}% {ideal[model][1]:>12,.0f} "
                  f"{cost - ideal[model][1]:>9,.0f}")
        total = sum(v[0] for v in types.by_type.values()), sum(v[1] for v in ideal.values())
        print(f"{'all':<44} {total[0]:>8,.0f} {'':>8} {'':>10} {total[1]:>12,.0f} {total[0] - total[1]:>9,.0f}")


def summed(ledger: WasteLedger, part) -> dict:
    """The ledger's [hours, node $, work $] summed by ``part(key)``."""
    out: dict = defaultdict(lambda: [0.0, 0.0, 0.0])
    for key, values in ledger.by_key.items():
        for i, v in enumerate(values):
            out[part(key)][i] += v
    return out


class TypeLedger:
    """Node $ and work $ per job type, a group's $/h split among its members by their work
    rates (pass ``observe`` as ``simulate(on_change=...)``, as ``WasteLedger``)."""

    def __init__(self) -> None:
        self.by_type: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._since = 0.0
        self._open: list[tuple[str, float, float]] = []  # (type, $/h, work $/h) until the next change

    def observe(self, now: float, state) -> None:
        hours = (now - self._since) / 3600.0
        for model, cost, work in self._open:
            self.by_type[model][0] += cost * hours
            self.by_type[model][1] += work * hours
        self._since, self._open = now, []
        for gid, group in state.groups.items():
            iteration = state.analysis(gid).iteration_s
            rates = {m.job.job_id: iteration_value(m.job, state.cluster) / iteration[m.job.job_id]
                     for m in group.members}
            share = state.group_cost_per_hour(gid) / sum(rates.values())  # the group's $ per $ of work
            self._open += [(m.job.model, share * rates[m.job.job_id], rates[m.job.job_id]) for m in group.members]


def alone_slo(state, group_id: str) -> float | None:
    """The SLO (to 0.1) of a group's only member; None for a group of several."""
    members = state.groups[group_id].members
    return round(members[0].job.slo, 1) if len(members) == 1 else None


if __name__ == "__main__":
    main()
