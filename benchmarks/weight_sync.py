"""Weight sync across pools: naive pull vs. scatter+broadcast, on a local multi-node Ray cluster.

Starts one local Ray node per RollMux node (``--train-nodes`` training nodes ``T0..``,
``--rollout-nodes`` rollout nodes ``R0..``; custom resources as in docs/ray.md), pins
one ``WeightSender`` per training node and one ``WeightReceiver`` per rollout node with
``RayJobRunner``, fills every sender with the same seeded random state dict of a
GPT-shaped model (tied embedding ``vocab x hidden`` plus ``layers`` blocks of q/k/v/o
``hidden x hidden`` and MLP ``4*hidden x hidden`` and two norms; ``--model-mb`` picks the
layer count, ``--dtype`` the element type) and runs ``naive_sync`` and
``scatter_broadcast_sync`` alternately, ``--repeats`` times each.

Columns: ``across pools`` / ``inside rollout`` = tensor payload bytes a sync read from
objects created on training nodes / on rollout nodes (rollmux.weight_sync defines both);
``seconds`` = median wall time of the repeats; ``x naive`` = the ratio to naive of the
bytes across pools and of the seconds, measured in the same run. After every sync each
receiver's weights are checked against the senders' by per-tensor SHA-256 (outside the
timing).

All nodes share this machine's memory and loopback, so both links run at the same speed
and both protocols move R x M bytes in all: the seconds show the protocols' overheads,
not the paper's gain. The bytes across pools are the point: naive moves R x M over the
slow link, scatter+broadcast M.

Usage::

    RAY_AUTH_MODE=disabled python benchmarks/weight_sync.py                  # 2 T + 4 R, 200 MB
    RAY_AUTH_MODE=disabled python benchmarks/weight_sync.py --model-mb 50 --rollout-nodes 2
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import ray
import torch

from rollmux.model import ROLLOUT, TRAIN
from rollmux.plan_state import Placement
from rollmux.runtime.ray_adapter import RayJobRunner, local_cluster
from rollmux.weight_sync import WeightReceiver, WeightSender, naive_sync, scatter_broadcast_sync

METHODS = {"naive": naive_sync, "scatter_broadcast": scatter_broadcast_sync}
VOCAB = 16000
MB = 1024**2


def model_shapes(model_mb: float, hidden: int, dtype: str) -> list[tuple[str, tuple[int, ...]]]:
    """A GPT-shaped state dict of about ``model_mb`` MiB (at least one block)."""
    item = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    block = [(f"attn.{p}", (hidden, hidden)) for p in "qkvo"] + [
        ("mlp.up", (4 * hidden, hidden)), ("mlp.down", (hidden, 4 * hidden)),
        ("norm1", (hidden,)), ("norm2", (hidden,))]
    block_bytes = sum(math.prod(shape) for _, shape in block) * item
    layers = max(1, round((model_mb * MB - VOCAB * hidden * item) / block_bytes))
    shapes = [("embed", (VOCAB, hidden))]
    shapes += [(f"layers.{i}.{name}", shape) for i in range(layers) for name, shape in block]
    return shapes + [("final_norm", (hidden,))]


def run(args: argparse.Namespace) -> dict:
    shapes = model_shapes(args.model_mb, args.hidden, args.dtype)
    rollout = tuple(f"R{i}" for i in range(args.rollout_nodes))
    train = tuple(f"T{i}" for i in range(args.train_nodes))
    store = max(100 * MB, int(4 * args.model_mb * MB))  # naive's peak: R x M / T per training node
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with local_cluster(rollout, train, object_store_memory=store):
        plan = Placement(group_id="g0", rollout_nodes=rollout, train_nodes=train)
        with RayJobRunner("weight-sync", plan, WeightReceiver, WeightSender, timeout_s=120) as runner:
            senders, receivers = runner.workers(TRAIN), runner.workers(ROLLOUT)
            model_bytes = ray.get([s.random_weights.remote(shapes, args.dtype, args.seed) for s in senders])[0]
            reports: dict[str, list] = {m: [] for m in METHODS}
            for _ in range(args.repeats):
                for name, sync in METHODS.items():
                    reports[name].append(sync(senders, receivers, verify=True))
    rows = {}
    for name, runs in reports.items():
        last = runs[-1]
        assert all((r.cross_pool_bytes, r.intra_pool_bytes) == (last.cross_pool_bytes, last.intra_pool_bytes)
                   for r in runs)
        rows[name] = {"cross_pool_bytes": last.cross_pool_bytes, "intra_pool_bytes": last.intra_pool_bytes,
                      "seconds": statistics.median(r.seconds for r in runs),
                      "seconds_all": [round(r.seconds, 4) for r in runs],
                      "stages": [dict(r.stages) for r in runs if r.stages]}
    return {"model_bytes": model_bytes, "tensors": len(shapes), "rollout_nodes": len(rollout),
            "train_nodes": len(train), "dtype": args.dtype, "repeats": args.repeats, "methods": rows}


def table(result: dict) -> str:
    naive = result["methods"]["naive"]
    lines = [f"model: {result['model_bytes'] / MB:.1f} MiB in {result['tensors']} {result['dtype']} tensors; "
             f"{result['train_nodes']} training nodes -> {result['rollout_nodes']} rollout nodes; "
             f"median of {result['repeats']} syncs each",
             f"{'method':<18} {'across pools':>14} {'inside rollout':>15} {'seconds':>8} "
             f"{'bytes x naive':>14} {'secs x naive':>13}"]
    for name, row in result["methods"].items():
        lines.append(f"{name:<18} {row['cross_pool_bytes'] / MB:>10.1f} MiB {row['intra_pool_bytes'] / MB:>11.1f} MiB "
                     f"{row['seconds']:>8.3f} {row['cross_pool_bytes'] / naive['cross_pool_bytes']:>14.3f} "
                     f"{row['seconds'] / naive['seconds']:>13.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-nodes", type=int, default=2)
    parser.add_argument("--rollout-nodes", type=int, default=4)
    parser.add_argument("--model-mb", type=float, default=200.0, help="state dict size in MiB (default 200)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.train_nodes < 1 or args.rollout_nodes < 1 or args.repeats < 1 or args.model_mb <= 0:
        parser.error("node counts and --repeats must be >= 1 and --model-mb > 0")
    result = run(args)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
