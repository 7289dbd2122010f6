"""Sleep and wake of a rollout engine's device memory (EngineMemory, torch_memory_saver); CUDA only.

For each size, bf16 "weights" (allocated as 256 MiB tensors inside ``EngineMemory.weights``)
and a KV-cache reservation (inside ``EngineMemory.cache``) are put to sleep and woken
``--cycles`` times, first with the library's default host backup (allocated at each sleep,
freed at each wake: ``fresh``), then with the backup kept between cycles (``kept``, what
EngineMemory sets). Measured in
the same run: one plain pinned ``copy_`` of the weights' bytes each way (the bound).

Columns: ``weights`` / ``cache`` GB; ``host`` which backup; ``sleep`` / ``wake`` medians
of the steady cycles (the first is shown apart as ``1st sleep``); ``GB/s`` = 2·weights /
(sleep + wake); ``of memcpy`` = bound / (sleep + wake); ``freed`` the device GB the driver
got back at sleep (weights and cache). Checked at every wake: the weights' bytes are
unchanged (a checksum).

Usage::

    python benchmarks/engine_sleep.py --json engine.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from state_switch import device_name, memcpy_bound  # noqa: E402

from rollmux.integrations.engine_memory import EngineMemory  # noqa: E402

CHUNK = 256 << 20  # bytes per weight tensor
SIZES = {"1.5B": (3.0, 20.0), "7B": (14.0, 40.0), "14B": (28.0, 40.0)}  # label: (weights GB, cache GB)


@dataclass(frozen=True)
class Row:
    label: str
    host: str
    weights_gb: float
    cache_gb: float
    first_sleep_s: float
    sleep_s: float
    wake_s: float
    gb_per_s: float
    of_memcpy: float
    freed_gb: float


def checksum(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.float().sum() for t in tensors))


def measure(label: str, cycles: int, bound: tuple[float, float]) -> list[Row]:
    """Both host-backup policies on one engine: fresh (the library's default), then kept."""
    from torch_memory_saver import torch_memory_saver

    weights_gb, cache_gb = SIZES[label]
    memory = EngineMemory(f"bench-{label}")
    with memory.weights():
        weights = [torch.randn(CHUNK // 2, device="cuda", dtype=torch.bfloat16)
                   for _ in range(int(weights_gb * 1e9) // CHUNK)]
    with memory.cache():
        cache = torch.empty(int(cache_gb * 1e9), dtype=torch.uint8, device="cuda")
    expected = checksum(weights)
    nbytes = sum(t.numel() * t.element_size() for t in weights)
    d2h, h2d = bound
    bound_s = nbytes / (d2h * 1e9) + nbytes / (h2d * 1e9)
    rows = []
    for host in ("fresh", "kept"):
        torch_memory_saver.retain_cpu_backup = host == "kept"
        sleeps, wakes = [], []
        for _ in range(cycles + 1):
            sleeps.append(memory.sleep())
            wakes.append(memory.wake())
            if checksum(weights) != expected:
                raise AssertionError(f"{label}: the weights changed across a sleep")
        sleep_s = statistics.median(r.seconds for r in sleeps[1:])
        wake_s = statistics.median(r.seconds for r in wakes[1:])
        freed = statistics.median((r.weights_bytes + r.cache_bytes) / 1e9 for r in sleeps)
        rows.append(Row(label, host, nbytes / 1e9, cache_gb, sleeps[0].seconds, sleep_s, wake_s,
                        2 * nbytes / (sleep_s + wake_s) / 1e9, bound_s / (sleep_s + wake_s), freed))
    del weights, cache
    torch.cuda.empty_cache()
    return rows


def format_table(rows: list[Row]) -> str:
    header = (f"{'model':>5} {'host':>5} {'weights':>7} {'cache':>6} {'1st sleep':>9} {'sleep':>7} {'wake':>7} "
              f"{'GB/s':>6} {'of memcpy':>9} {'freed':>7}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.label:>5} {r.host:>5} {r.weights_gb:>7.2f} {r.cache_gb:>6.1f} {r.first_sleep_s:>9.3f} "
                     f"{r.sleep_s:>7.3f} {r.wake_s:>7.3f} {r.gb_per_s:>6.2f} {r.of_memcpy:>9.0%} "
                     f"{r.freed_gb:>6.2f}G")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="1.5B,7B", help=f"comma-separated of {list(SIZES)}")
    parser.add_argument("--cycles", type=int, default=3, help="steady sleep+wake cycles per row")
    parser.add_argument("--json", default=None, help="also write the rows and the setup here")
    args = parser.parse_args(argv)
    labels = args.models.split(",")
    unknown = [label for label in labels if label not in SIZES]
    if unknown:
        parser.error(f"--models: unknown label(s) {unknown}; choose from {list(SIZES)}")
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    if device is None:
        parser.error("needs a CUDA device")
    bound = memcpy_bound(1 << 31, device)
    print(f"device: {device_name(device)}; torch {torch.__version__}; memcpy {bound[0]:.1f} GB/s d2h, "
          f"{bound[1]:.1f} GB/s h2d; cycles {args.cycles}", flush=True)
    rows = []
    for label in labels:
        for row in measure(label, args.cycles, bound):
            rows.append(row)
            print(f"  done {label} ({row.host}): sleep {row.sleep_s:.3f} s, wake {row.wake_s:.3f} s", flush=True)
    print(format_table(rows))
    if args.json:
        setup = {"command": " ".join(["engine_sleep.py", *(argv if argv is not None else sys.argv[1:])]),
                 "device": device_name(device), "torch": torch.__version__, "cycles": args.cycles}
        Path(args.json).write_text(json.dumps({"setup": setup, "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
