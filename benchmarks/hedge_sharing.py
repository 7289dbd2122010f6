"""``rollmux-hedge`` on two pools: a pack charged at the planner's dE or at dE_share.

Until 2026-11-28 ``rollmux-hedge`` compared an arrival's candidates on two pools by the
planner's marginal $/h dE (``rollmux.fleet_planner``), under which a pack that adds no
node costs 0 however much it slows the group, so it always beat the job's own Gavel+
option. Now it takes dE_share there too, as every policy does on a fleet of several
views: the rise of the group's E at its members' analysed iterations. This replays
both, in the same run, on the same traces (worst-case durations unless
``--duration-model stochastic``):

* ``production`` with its shipped SLO draw (0) and draws 1-3 (SLOs drawn again in
  [1.1, 2.0], ``benchmarks/trace_variants.py``),
* ``philly-mix`` with its shipped draw (0) and draws 1-3 (``load_trace(seed=s)``),
* ``generate(200, seed)`` for seeds 3-6 (``rollmux.traces.generate``),

and prints each bill, the SLO attainment and dE_share over dE.

    python benchmarks/hedge_sharing.py [--draws 0,1,2,3] [--synthetic 3,4,5,6]
                                       [--duration-model worst|stochastic]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rollmux.fleet import Profiles, fleet_of
from rollmux.model import Cluster
from rollmux.planner import FULL_SPACE
from rollmux.policies.fleet import FleetRollMux
from rollmux.sim.engine import simulate
from rollmux.traces.generate import generate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_variants import variant  # noqa: E402  (the draws of the builtin traces)


def hedge(cluster: Cluster, sharing_cost: bool) -> FleetRollMux:
    """``rollmux-hedge`` on ``cluster``, with the pack's marginal by dE_share or by dE."""
    return FleetRollMux(fleet_of(cluster), Profiles(), FULL_SPACE, name="rollmux-hedge", regroup=True, hedge=True,
                        sharing_cost=sharing_cost)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", default="0,1,2,3", help="draws of production and philly-mix (0: as shipped)")
    ap.add_argument("--synthetic", default="3,4,5,6", help="seeds of generate(200, seed)")
    ap.add_argument("--duration-model", default="worst", choices=("worst", "stochastic"))
    args = ap.parse_args()
    cluster = Cluster()
    cases = [(trace, int(d), lambda t=trace, d=int(d): variant(t, d, cluster))
             for trace in ("production", "philly-mix") for d in args.draws.split(",") if d]
    cases += [("synthetic-200", int(s), lambda s=int(s): generate(200, s)) for s in args.synthetic.split(",") if s]
    print(f"rollmux-hedge on two pools, {args.duration_model} durations: a pack by dE (before) and by dE_share (now)")
    print(f"{'trace':>14} {'draw':>5} {'dE $/h':>9} {'SLO':>7} {'dE_share $/h':>13} {'SLO':>7} {'ratio':>7} "
          f"{'wall s':>7}")
    ratios = []
    for trace, draw, jobs_of in cases:
        jobs = jobs_of()
        t0 = time.perf_counter()
        row = []
        for sharing in (False, True):
            s = simulate(jobs, cluster, hedge(cluster, sharing), duration_model=args.duration_model).summary()
            row.append((s["cost_per_hour"], s["slo_attainment"]))
        ratio = row[1][0] / row[0][0]
        ratios.append(ratio)
        print(f"{trace:>14} {draw:>5} {row[0][0]:>9.2f} {row[0][1]:>7.1%} {row[1][0]:>13.2f} {row[1][1]:>7.1%} "
              f"{ratio:>7.4f} {time.perf_counter() - t0:>7.1f}", flush=True)
    cheaper = sum(r < 1 for r in ratios)
    print(f"dE_share / dE: mean {statistics.fmean(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}; "
          f"cheaper on {cheaper} of {len(ratios)}")


if __name__ == "__main__":
    main()
