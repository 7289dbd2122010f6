"""How often planned groups settle above an SLO in states the planner's check never saw.

For each placement space and job mix, ``rollmux.histories.check_planner`` plans 12
random jobs per seed and runs every group of two or more through six perturbed
histories on the execution rule: staggered admissions, a spell of phases shorter than
their worst case (``noisy``; ``worst`` keeps every phase at its worst case), and in every
other history a member leaving mid-phase. Each remaining member's mean iteration over
300 iterations, after 400 more once the history is over, is compared with its SLO. The
one-start row is the control. It is the default space with the check of every start
switched off, and it shows that the histories do break checks. The one-order rows are
the paper's and the full space as they were before the check of every order of a group's
members (``Space.all_orders``).

Columns: ``groups`` planned groups of 2+; ``histories`` run; ``groups missed`` groups
with a member above its SLO in some history; ``members`` such (history, member) pairs;
``worst`` the largest slowdown / SLO among them.

    python benchmarks/slo_histories.py [--seeds 100] [--histories 6] [--phases worst|noisy|both]
                                       [--spaces "paper (default),full"]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

from rollmux.histories import check_planner
from rollmux.planner import FULL_SPACE, HOSTING_SPACE, PAPER_SPACE, Space

SPACES = {"one start (control)": Space(all_starts=False), "one order (control)": Space(all_orders=False),
          "paper (default)": PAPER_SPACE, "full (one order)": replace(FULL_SPACE, all_orders=False),
          "full": FULL_SPACE, "paper + hosting": HOSTING_SPACE}
MIXES = ("mixed", "train-heavy", "rollout-heavy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=100, help="seeds per row (0 .. seeds-1)")
    ap.add_argument("--histories", type=int, default=6, help="histories per group")
    ap.add_argument("--spaces", default=",".join(SPACES), help="comma-separated rows among: " + ", ".join(SPACES))
    ap.add_argument("--phases", choices=("worst", "noisy", "both"), default="both",
                    help="worst: worst-case phases throughout; noisy: with a spell of shorter ones")
    args = ap.parse_args()
    print(f"{'space':<20} {'mix':<14} {'phases':<6} {'groups':>7} {'histories':>9} {'groups missed':>13} "
          f"{'members':>8} {'worst':>7} {'wall s':>7}", flush=True)
    kinds = ("worst", "noisy") if args.phases == "both" else (args.phases,)
    names = [n.strip() for n in args.spaces.split(",") if n.strip()]
    for name in names:
        if name not in SPACES:
            ap.error(f"--spaces {name!r}: expected some of {', '.join(SPACES)}")
    for name in names:
        space = SPACES[name]
        for mix in MIXES:
            for phases in kinds:
                t = time.perf_counter()
                r = check_planner(space, mix, range(args.seeds), histories=args.histories, noise=phases == "noisy")
                worst = f"{r.worst_excess:.3f}" if r.misses else "-"
                print(f"{name:<20} {mix:<14} {phases:<6} {r.groups:>7} {r.histories:>9} {r.groups_missed:>13} "
                      f"{len(r.misses):>8} {worst:>7} {time.perf_counter() - t:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
