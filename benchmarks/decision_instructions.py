"""Instructions per planner decision, counted by valgrind: a measure the machine's noise
cannot move.

``planner_latency.py`` times decisions on a shared machine, where the same command moves
by a third from one minute to the next. This script runs the same workload (the
synthetic mix, ``--repeats`` draws of N running jobs, ``--probes`` arrivals each decided
once from the analysis memo the plan's construction left) under callgrind, with a dump
at each decision's start and end (``os.getpid`` marks them), and prints per N the median
of the draws' median instruction counts and the p99, next to a baseline source tree run
the same way in the same invocation (``--baseline``: another checkout with its kernel
built, e.g. ``git worktree add /tmp/old <rev>`` then ``rollmux kernel build`` there).
Needs valgrind; slow (about 50x a plain run).

``--policy rollmux-hedge`` counts that policy's placement instead (the ``answer`` of
``planner_latency.py --policy rollmux-hedge``: the same builds, each probe placed on a
copy of the plan made before its first mark).

    python benchmarks/decision_instructions.py [--sizes 5,9,13] [--space full] [--baseline /tmp/old]
                                               [--policy rollmux-hedge]
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(n: int, space: str, repeats: int, probes: int, policy: str) -> None:
    """The decisions themselves (run under callgrind by ``count``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import planner_latency as pl
    from rollmux import kernel
    from rollmux.planner import Planner

    if policy == "rollmux-hedge":  # its placement (the answer to a submit), each from a copy of the plan
        import copy

        for r in range(repeats):
            hedge, plan, jobs = pl.hedge_build(n, 1 + r)
            memo = kernel.memo_snapshot()
            for job in jobs[:probes]:
                kernel.memo_restore(memo)
                p, s = copy.deepcopy((hedge, plan))
                os.getpid()
                p.place(s, job)
                os.getpid()
        return
    planner = Planner("first", space=pl.SPACES[space])
    for r in range(repeats):
        state, jobs = pl.build(n, 1 + r, "first", "synthetic", space)
        memo = kernel.memo_snapshot()
        for job in jobs[:probes]:
            kernel.memo_restore(memo)
            os.getpid()  # a dump: the decision starts
            planner.decide(state, job)
            os.getpid()  # a dump: it ended


def count(tree: Path, n: int, space: str, repeats: int, probes: int, policy: str) -> list[list[int]]:
    """Instructions of each decision, by draw, for the package under ``tree``/src."""
    out = Path(tempfile.mkdtemp(prefix="rollmux-callgrind-"))
    try:
        env = dict(os.environ, PYTHONPATH=str(tree / "src"))
        cmd = ["valgrind", "--tool=callgrind", "--dump-before=getpid", f"--callgrind-out-file={out}/cg.out",
               sys.executable, str(Path(__file__).resolve()), "--child", str(n), "--space", space,
               "--repeats", str(repeats), "--probes", str(probes), "--policy", policy]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        totals: dict[int, int] = {}
        for f in glob.glob(f"{out}/cg.out.*"):
            with open(f) as fh:
                for line in fh:
                    if line.startswith("summary:"):
                        totals[int(f.rsplit(".", 1)[1])] = int(line.split()[1])
                        break
        # dump 1 runs to the first mark; then each decision, then the gap to the next one
        decisions = [totals[k] for k in sorted(totals) if k >= 2 and k % 2 == 0]
        if len(decisions) != repeats * probes:
            raise SystemExit(f"expected {repeats * probes} decisions under callgrind, found {len(decisions)}")
        return [decisions[i * probes:(i + 1) * probes] for i in range(repeats)]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def summary(draws: list[list[int]]) -> tuple[float, float]:
    flat = sorted(x for d in draws for x in d)
    return statistics.median(statistics.median(d) for d in draws) / 1e6, flat[int(0.99 * len(flat))] / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5,9,13")
    ap.add_argument("--space", default="full", choices=("paper", "full"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--baseline", type=Path, help="another source tree (its src/ is imported), run the same way")
    ap.add_argument("--policy", default="rollmux", choices=("rollmux", "rollmux-hedge"),
                    help="rollmux: the planner's decision in --space; rollmux-hedge: that policy's placement, "
                         "as planner_latency.py --policy rollmux-hedge builds and probes it (answer ms)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.space, args.repeats, args.probes, args.policy)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: this benchmark counts instructions with callgrind")
    trees = [("this tree", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    what = "policy: rollmux-hedge (placement)" if args.policy == "rollmux-hedge" else f"placement space: {args.space}"
    print(f"{what}; {args.repeats} draws x {args.probes} decisions per N; "
          "M instructions per decision (median of the draws' medians; p99)")
    head = f"{'N':>4}" + "".join(f" {name + ' median':>17} {'p99':>8}" for name, _ in trees)
    print(head + ("  baseline / this (median, p99)" if args.baseline else ""))
    for n in (int(x) for x in args.sizes.split(",")):
        results = [summary(count(tree, n, args.space, args.repeats, args.probes, args.policy)) for _, tree in trees]
        row = f"{n:>4}" + "".join(f" {med:>17.2f} {p99:>8.1f}" for med, p99 in results)
        if args.baseline:
            (m0, p0), (m1, p1) = results
            row += f"  {m1 / m0:.2f}x, {p1 / p0:.2f}x"
        print(row, flush=True)


if __name__ == "__main__":
    main()
