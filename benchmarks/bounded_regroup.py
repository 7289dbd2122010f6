"""Regrouping on a fixed cluster: each regrouping policy with its regroupings on and off.

Replays the first J jobs of the production trace (worst-case durations, our accounting)
on clusters of R H20 and T H800 nodes (bounded pools: jobs queue for free nodes and SLOs
are judged end to end, wait included). Each policy runs twice in the same process: as
shipped, where a regrouping holds the nodes its new groups will take
(``rollmux.reservation``), and with its ``regroup`` step removed, which is how it ran on
bounded pools before (regrouping then needed unbounded pools). ``rollmux`` is printed
for reference. The last column is the bill with regrouping over the bill without.

    python benchmarks/bounded_regroup.py [--clusters 12x10:40,24x16:200] [--policies ...] [--queue backfill|fifo]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

from rollmux.model import Cluster
from rollmux.policies import make_policy
from rollmux.sim.engine import simulate
from rollmux.traces.builtin import load_trace

NODES_AND_JOBS = "RxT:J (R H20 nodes, T H800 nodes, the first J jobs; whole numbers >= 1)"


def fixed_cluster(rollout: int, train: int) -> Cluster:
    """The paper's testbed with ``rollout`` H20 and ``train`` H800 nodes."""
    base = Cluster()
    return replace(base, rollout=replace(base.rollout, nodes=rollout), train=replace(base.train, nodes=train))


def timed(jobs, cluster: Cluster, policy, backfill: bool = True):
    """``simulate`` of copies of ``jobs`` under ``policy`` (the waiting line backfilled by
    packing, or strictly first come, first placed), and its wall seconds."""
    t = time.perf_counter()
    result = simulate([replace(j) for j in jobs], cluster, policy, backfill=backfill)
    return result, time.perf_counter() - t


def nodes_and_jobs(spec: str) -> tuple[int, int, int]:
    """``RxT:J`` as (R, T, J); ValueError unless ``spec`` has that form."""
    nodes, _, count = spec.partition(":")
    rollout, _, train = nodes.partition("x")
    if not all(part.isdecimal() and int(part) >= 1 for part in (rollout, train, count)):
        raise ValueError(f"expected {NODES_AND_JOBS}")
    return int(rollout), int(train), int(count)


def policy_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """``--policies``' comma-separated names, or the parser's error naming an unknown one."""
    names = text.split(",")
    for name in names:
        try:
            make_policy(name)
        except ValueError as err:
            parser.error(f"--policies: {err}")
    return names


def add_queue_option(parser: argparse.ArgumentParser) -> None:
    """``--queue``, the waiting line's order (``simulate(backfill=)``), for the bounded benchmarks."""
    parser.add_argument("--queue", default="backfill", choices=("backfill", "fifo"),
                        help="the waiting line: backfilled by packing (as shipped) or strictly first come, first placed")


def run(jobs, cluster: Cluster, name: str, regroup: bool, backfill: bool = True):
    policy = make_policy(name, cluster=cluster)
    if not regroup:
        policy.regroup = None
    return timed(jobs, cluster, policy, backfill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", default="12x10:40,16x14:60,24x20:100,24x16:200,40x32:200",
                        help="RxT:J, comma-separated: R H20 nodes, T H800 nodes, the first J production jobs")
    parser.add_argument("--policies", default="rollmux-regroup,rollmux-hedge")
    add_queue_option(parser)
    args = parser.parse_args()
    clusters = []
    for spec in args.clusters.split(","):
        try:
            clusters.append(nodes_and_jobs(spec))
        except ValueError as err:
            parser.error(f"--clusters {spec!r}: {err}")
    names = policy_names(parser, args.policies)
    backfill = args.queue == "backfill"
    print(f"{'cluster':>14} {'policy':>16} {'regroup':>8} {'$/h':>7} {'SLO e2e':>8} {'wait h':>7} "
          f"{'regroupings':>12} {'wall s':>7} {'on/off':>7}")
    for r, t, count in clusters:
        cluster = fixed_cluster(r, t)
        jobs = load_trace("production", cluster)[0][:count]
        label = f"{r}+{t} / {count}"
        ref, wall = run(jobs, cluster, "rollmux", False, backfill)
        print(f"{label:>14} {'rollmux':>16} {'-':>8} {ref.cost_per_hour:>7.1f} {ref.slo_attainment:>8.1%} "
              f"{ref.summary()['mean_wait_s'] / 3600:>7.1f} {'-':>12} {wall:>7.1f} {'-':>7}")
        for name in names:
            off, wall_off = run(jobs, cluster, name, False, backfill)
            on, wall_on = run(jobs, cluster, name, True, backfill)
            for tag, res, wall in (("off", off, wall_off), ("on", on, wall_on)):
                ratio = f"{on.total_cost / off.total_cost:>7.3f}" if tag == "on" else f"{'':>7}"
                print(f"{label:>14} {name:>16} {tag:>8} {res.cost_per_hour:>7.1f} {res.slo_attainment:>8.1%} "
                      f"{res.summary()['mean_wait_s'] / 3600:>7.1f} {res.outcomes.get('regroupings', 0):>12} "
                      f"{wall:>7.1f} {ratio}")


if __name__ == "__main__":
    main()
