"""The analysis kernel compiled (``rollmux.native``) against its source, with and without
the C simulation loop, in the same run.

Draws random synchronous groups of 2 to 5 members over three rollout and three training
nodes (shared and private nodes, switch seconds or none) and times, with an empty memo
each round, ``shape_of`` (one start, as ``intra.analyze``) and ``worst_iterations``
(every start; every order too for up to four members, as ``intra.worst_start`` for the
planner's check). Three kernels take turns round by round, so that all see the same
spells of a shared machine, and each keeps its fastest round: the one the package
imports (compiled, with the C loop, where they are built), the source loaded beside it
as a second module with its own memo (with the C loop where it is built), and the
source with its own Python loop (``pure``: the kernel with nothing built). All must
return the same answers. Prints seconds per entry point and the ratios to the imported
kernel.

    python benchmarks/kernel_speed.py [--groups 400] [--seed 3] [--rounds 7]
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time

from rollmux import kernel, native


def groups(count: int, seed: int) -> list[tuple]:
    """Synchronous memo keys, nodes numbered by first use (``intra.sync_key``)."""
    rng = random.Random(seed)
    keys = []
    for _ in range(count):
        rename: dict[int, int] = {}
        rows = []
        for _ in range(rng.randint(2, 5)):
            roll = sorted(rng.sample(range(3), rng.randint(1, 2)))
            train = sorted(rng.sample(range(3, 6), rng.randint(1, 2)))
            rows.append((round(rng.uniform(20, 300), 3), round(rng.uniform(20, 300), 3),
                         tuple(rename.setdefault(x, len(rename)) for x in roll),
                         tuple(rename.setdefault(x, len(rename)) for x in train),
                         rng.choice((0.0, round(rng.uniform(1, 10), 3))), rng.choice((0.0, round(rng.uniform(1, 10), 3)))))
        keys.append(tuple(rows))
    return keys


def source_kernel(name: str, c_loop: bool = True):
    """``kernel.py`` itself, imported as a module of its own (its own memo); without
    ``c_loop``, it runs its Python loop for every key."""
    spec = importlib.util.spec_from_file_location(name, native.SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not c_loop:
        module._csim = None  # read by each key's set-up
    return module


ENTRY_POINTS = {
    "shape_of": lambda k, key: k.shape_of(key).iteration_s,
    "worst_iterations": lambda k, key: k.worst_iterations(key, len(key) <= 4, None),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=400)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    keys = groups(args.groups, args.seed)
    kernels = {"imported": kernel, "source": source_kernel("rollmux._kernel_source"),
               "pure": source_kernel("rollmux._kernel_pure", c_loop=False)}
    print(f"{args.groups} groups of 2-5 members (seed {args.seed}), fastest of {args.rounds} alternating rounds")
    print(f"imported: {native.status()}; simulation loop: {native.simulator_status()}")
    print(f"{'entry point':<18} {'imported s':>11} {'source s':>9} {'pure s':>8} {'source / imported':>18} "
          f"{'pure / imported':>16}")
    for name, call in ENTRY_POINTS.items():
        best = dict.fromkeys(kernels, float("inf"))
        answers = {}
        for _ in range(args.rounds):
            for label, k in kernels.items():
                k.memo_restore(({}, {}))
                t = time.perf_counter()
                answers[label] = [call(k, key) for key in keys]
                best[label] = min(best[label], time.perf_counter() - t)
        if not answers["imported"] == answers["source"] == answers["pure"]:
            sys.exit(f"{name}: the kernels gave different answers")
        print(f"{name:<18} {best['imported']:>11.4f} {best['source']:>9.4f} {best['pure']:>8.4f} "
              f"{best['source'] / best['imported']:>17.2f}x {best['pure'] / best['imported']:>15.2f}x")


if __name__ == "__main__":
    main()
