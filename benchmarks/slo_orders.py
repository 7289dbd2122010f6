"""What the check of every order of a group's members catches that one order does not.

For each seed and mix, 12 random jobs (``traces.generate``) are planned as before the check
of every order (``Space.all_orders`` off, the check of every start on). Every group of two
or more is then judged three ways:

* ``flagged``: the check of every order (``intra.worst_start(orders=True)``) finds a
  member above its SLO, so today's planner would not have formed the group;
* ``oracle``: ``rollmux.histories``' six histories per group (``stress_plan``) settle a
  member above its SLO;
* ``reached``: for a flagged group only, ``--histories`` more histories of the same kind
  settle a member above its SLO (the flag is a schedule the group can really reach).

A group the oracle catches and the check does not flag would be a hole in the new check.

    python benchmarks/slo_orders.py [--seeds 100] [--space paper|full] [--histories 200]
                                    [--mix mixed,train-heavy,rollout-heavy]
"""
from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from rollmux.histories import group_histories, stress_plan
from rollmux.intra import worst_start
from rollmux.model import Cluster
from rollmux.plan_state import PlanState
from rollmux.planner import FULL_SPACE, PAPER_SPACE, SLO_EPS, Planner
from rollmux.traces.generate import generate

SPACES = {"paper": PAPER_SPACE, "full": FULL_SPACE}
MIXES = ("mixed", "train-heavy", "rollout-heavy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="seeds per mix (0 .. seeds-1)")
    ap.add_argument("--space", choices=tuple(SPACES), default="paper")
    ap.add_argument("--histories", type=int, default=200, help="extra histories per flagged group")
    ap.add_argument("--mix", default=",".join(MIXES), help=f"comma-separated among {', '.join(MIXES)}")
    args = ap.parse_args()
    mixes = [m.strip() for m in args.mix.split(",") if m.strip()]
    if not mixes or any(m not in MIXES for m in mixes):
        ap.error(f"--mix {args.mix!r}: expected names among {', '.join(MIXES)}, comma-separated")
    space = replace(SPACES[args.space], all_orders=False)
    print(f"{args.space} space planned with one order; {args.seeds} seeds per mix", flush=True)
    print(f"{'mix':<14} {'groups':>7} {'flagged':>8} {'oracle':>7} {'oracle, not flagged':>20} "
          f"{'flagged, reached':>17} {'wall s':>7}", flush=True)
    details = []
    for mix in mixes:
        t = time.perf_counter()
        groups = flagged = oracle = hole = reached = 0
        for seed in range(args.seeds):
            state, planner = PlanState(Cluster()), Planner("first", space=space)
            for job in generate(12, seed, mix=mix):
                state.apply(job, planner.decide(state, job).placement)
            missed = {m.group_id for m in stress_plan(state, 6, seed) if m.missed}
            for gid, group in state.groups.items():
                if len(group.members) < 2:
                    continue
                groups += 1
                profiles = [state.profile(m, group.colocated) for m in group.members]
                every = worst_start(profiles, orders=True)
                over = {m.job.job_id: every[p.job_id] / p.t_solo for m, p in zip(group.members, profiles)
                        if every[p.job_id] > m.job.slo * p.t_solo * (1 + SLO_EPS)}
                oracle += gid in missed
                hole += gid in missed and not over
                if not over:
                    continue
                flagged += 1
                settled = group_histories(state, gid, args.histories, random.Random(seed), seed=seed)
                worst = {}
                for m in settled:
                    worst[m.job_id] = max(worst.get(m.job_id, 0.0), m.slowdown)
                hit = any(m.missed for m in settled)
                reached += hit
                details.append((mix, seed, gid, {k: round(v, 4) for k, v in over.items()},
                                {k: round(worst[k], 4) for k in over}, hit, gid in missed))
        print(f"{mix:<14} {groups:>7} {flagged:>8} {oracle:>7} {hole:>20} {reached:>17} "
              f"{time.perf_counter() - t:>7.0f}", flush=True)
    for mix, seed, gid, over, worst, hit, caught in details:
        print(f"  {mix} seed {seed} {gid}: every order {over}; worst of {args.histories} histories {worst}"
              f"{' (reached)' if hit else ''}{' (the six-history oracle caught it)' if caught else ''}")


if __name__ == "__main__":
    main()
