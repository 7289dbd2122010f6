"""Warm switches of an FSDP2-sharded trainer (ShardedTrainerState) against StateCache and memcpy.

For each GPT-style model of ``state_switch.py`` (fp32 parameters and Adam state, 12
bytes per parameter) this benchmark measures, in the same run:

* ``StateCache`` on the plain model: the baseline, offload + load (steady cycles);
* ``ShardedTrainerState`` on the same model wrapped with ``fully_shard`` (one block per
  FSDP unit) in a one-rank process group (NCCL on CUDA, gloo on CPU): offload + load;
* the physical bound: one plain ``copy_`` of the same bytes each way (pinned on CUDA).

Columns: ``GB`` state bytes; ``1st off`` the sharded first offload (allocates and pins
the host buffers); ``offload`` / ``load`` / ``warm`` sharded medians; ``GB/s`` =
2·bytes/warm; ``of memcpy`` = bound/warm; ``cache warm`` the StateCache round trip;
``vs cache`` = cache warm / sharded warm (above 1: the sharded hook is faster);
``resident`` and ``parked`` the device memory allocated by torch with the trainer
resident and parked (CUDA only: on CPU it is the same memory).

One rank: each rank of a real job moves only its shard, in parallel over its own link,
so an N-rank job's switch takes about the one-rank time of 1/N of the model; the barrier
adds the slowest rank's lag (the tests check the collective path on two gloo ranks).

Usage::

    python benchmarks/sharded_switch.py                          # CPU, 10M..150M
    python benchmarks/sharded_switch.py --device cuda --json sharded.json
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from state_switch import CONFIGS, GPT, ModelConfig, build_job, device_name, memcpy_bound  # noqa: E402

from rollmux.integrations.sharded import ShardedTrainerState  # noqa: E402
from rollmux.runtime.state_cache import StateCache  # noqa: E402

CPU_LABELS = ("10M", "50M", "150M")
GPU_LABELS = ("150M", "400M", "1B")


@dataclass(frozen=True)
class Row:
    label: str
    params: int
    bytes: int
    first_offload_s: float
    offload_s: float
    load_s: float
    warm_s: float
    gb_per_s: float
    bound_s: float
    of_memcpy: float
    cache_warm_s: float
    vs_cache: float
    resident_gb: float
    parked_gb: float


def sharded_job(config: ModelConfig, device: torch.device) -> tuple[GPT, torch.optim.Adam]:
    """The model sharded with fully_shard, and an Adam whose state exists for every shard."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    with torch.device(device):
        model = GPT(config)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for param in model.parameters():
        param.grad = torch.full_like(param, 1e-3)
        optimizer.step()
        param.grad = None
    return model, optimizer


def release(device: torch.device) -> None:
    """Collect the dropped model (FSDP modules hold reference cycles) and free its blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def allocated_gb(device: torch.device) -> float:
    return torch.cuda.memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")


def measure(config: ModelConfig, device: torch.device, cycles: int) -> Row:
    model, optimizer = build_job(config, device, torch.float32)
    params = sum(p.numel() for p in model.parameters())
    cache = StateCache(budget_bytes=64 * params * 4)
    cache.register(config.label, model, optimizer)
    cache_warm = []
    for _ in range(cycles + 1):
        cache_warm.append(cache.offload(config.label).seconds + cache.load(config.label, device).seconds)
    cache.remove(config.label)
    del model, optimizer, cache
    release(device)

    model, optimizer = sharded_job(config, device)
    state = ShardedTrainerState(model, optimizer, budget_bytes=64 * params * 4, key=config.label)
    resident = allocated_gb(device)
    offloads, loads, parked = [], [], float("nan")
    for _ in range(cycles + 1):
        offloads.append(state.offload())
        parked = allocated_gb(device)
        loads.append(state.load())
    nbytes = offloads[0].bytes
    state.close()
    del model, optimizer, state
    release(device)

    d2h, h2d = memcpy_bound(nbytes, device)
    offload_s = statistics.median(r.seconds for r in offloads[1:])
    load_s = statistics.median(r.seconds for r in loads[1:])
    warm_s = offload_s + load_s
    bound_s = nbytes / (d2h * 1e9) + nbytes / (h2d * 1e9)
    cache_warm_s = statistics.median(cache_warm[1:])
    return Row(config.label, params, nbytes, offloads[0].seconds, offload_s, load_s, warm_s,
               2 * nbytes / warm_s / 1e9, bound_s, bound_s / warm_s, cache_warm_s, cache_warm_s / warm_s,
               resident, parked)


def gb(value: float) -> str:
    return "-" if value != value else f"{value:.2f}G"


def format_table(rows: list[Row]) -> str:
    header = (f"{'model':>6} {'params':>8} {'GB':>6} {'1st off':>8} {'offload':>8} {'load':>8} {'warm':>7} "
              f"{'GB/s':>6} {'of memcpy':>9} {'cache warm':>10} {'vs cache':>8} {'resident':>8} {'parked':>7}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.label:>6} {r.params / 1e6:>7.1f}M {r.bytes / 1e9:>6.2f} {r.first_offload_s:>8.3f} "
            f"{r.offload_s:>8.3f} {r.load_s:>8.3f} {r.warm_s:>7.3f} {r.gb_per_s:>6.2f} {r.of_memcpy:>9.0%} "
            f"{r.cache_warm_s:>10.3f} {r.vs_cache:>7.2f}x {gb(r.resident_gb):>8} {gb(r.parked_gb):>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated labels of {[c.label for c in CONFIGS]} "
                             f"(default {','.join(CPU_LABELS)} on CPU, {','.join(GPU_LABELS)} on CUDA)")
    parser.add_argument("--cycles", type=int, default=3, help="steady offload+load cycles per model")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the rows and the setup here")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    labels = args.models.split(",") if args.models else (GPU_LABELS if device.type == "cuda" else CPU_LABELS)
    known = {c.label: c for c in CONFIGS}
    unknown = [label for label in labels if label not in known]
    if unknown:
        parser.error(f"--models: unknown label(s) {unknown}; choose from {sorted(known)}")

    with tempfile.TemporaryDirectory() as store:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"file://{store}/pg",
                                rank=0, world_size=1)
        try:
            print(f"device: {device_name(device)}; torch {torch.__version__}; one rank; "
                  f"state = fp32 params + Adam; cycles {args.cycles}", flush=True)
            rows = []
            for label in labels:
                rows.append(measure(known[label], device, args.cycles))
                print(f"  done {label}: sharded warm {rows[-1].warm_s:.3f} s, "
                      f"StateCache warm {rows[-1].cache_warm_s:.3f} s", flush=True)
        finally:
            dist.destroy_process_group()
    print(format_table(rows))
    if args.json:
        setup = {"command": " ".join(["sharded_switch.py", *(argv if argv is not None else sys.argv[1:])]),
                 "device": device_name(device), "torch": torch.__version__, "cycles": args.cycles}
        Path(args.json).write_text(json.dumps({"setup": setup, "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
