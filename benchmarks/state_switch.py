"""Warm (host memory) vs. cold (disk) state switches of StateCache, against memcpy bounds.

For each random-initialised GPT-style model (embedding, pre-norm blocks with attention
and MLP projections; vocab 32000) this benchmark builds the model and an Adam optimizer
with its state materialised (every parameter stepped once), registers it in a
:class:`rollmux.runtime.state_cache.StateCache`, and measures:

* cold: ``save_cold`` from the device (safetensors + torch.save, fsynced) and, after the
  files are dropped from the page cache (``posix_fadvise(DONTNEED)``, so the read comes
  from the disk), ``load_cold`` back onto the device;
* warm: ``--cycles`` (at least 2) offload+load cycles; the first offload also allocates
  (and on CUDA pins) the host buffers and is reported apart; the table's offload and
  load are the medians of the later cycles;
* the physical bound: one plain ``copy_`` of a same-size byte tensor (at most 2 GiB,
  then scaled) device->host and host->device (pinned host memory on CUDA; on CPU both
  ends are ordinary host tensors), best of three.

Columns: ``warm`` = steady offload + load seconds; ``GB/s`` = 2*bytes/warm;
``of memcpy`` = bound seconds / warm seconds; ``cold`` = save + load seconds;
``cold/warm`` = cold/warm for the round trip and ``load c/w`` for the switch-in alone
(the paper's Figure 4 compares switch-in latencies).

What is covered: the training state of a job (parameters, buffers, optimizer state in
full precision: 12 bytes per parameter with fp32 Adam) moving between one device and
this host. What is not covered:

* A rollout (vLLM) job's state is its weights plus a KV-cache reservation. The weights
  move exactly like the parameters here (a rollout holds no optimizer state, so about
  a third of the bytes for fp32, less in bf16). The KV reservation is a large *empty*
  buffer: it is freed on offload and reallocated on load, never copied, so it adds an
  allocation (cudaMalloc of tens of GB, milliseconds) but no transfer time.
* Cold numbers here are storage-only: they exclude what the paper's cold start also
  pays (process and CUDA-context start, NCCL/Ray control plane, engine warm-up and
  CUDA-graph capture), so the measured cold/warm ratio is a lower bound on the paper's.
* On CPU, "device" and host are both host memory, so the numbers only check the
  mechanics (and each load pays page faults for freshly allocated "device" tensors).
  On a small, oversubscribed VM torch's parallel copies can stall at OpenMP barriers;
  ``--threads 1`` avoids that.
* One device and one host: no tensor-parallel sharding across the 8 GPUs of a node
  (each GPU moves its shard in parallel over its own PCIe link), no NUMA placement.

Usage::

    python benchmarks/state_switch.py                      # CPU, 10M..400M
    python benchmarks/state_switch.py --max-params 50M     # smaller
    python benchmarks/state_switch.py --device cuda --full --json gpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rollmux.runtime.state_cache import OPTIMIZER_FILE, TENSORS_FILE, StateCache

VOCAB = 32000
BOUND_CAP_BYTES = 2 << 30


@dataclass(frozen=True)
class ModelConfig:
    """A GPT-style shape: ``width`` hidden size, ``depth`` blocks."""

    label: str
    width: int
    depth: int


CONFIGS = (
    ModelConfig("10M", 256, 2),
    ModelConfig("50M", 512, 10),
    ModelConfig("150M", 768, 18),
    ModelConfig("400M", 1024, 30),
    ModelConfig("1B", 2048, 19),
)
DEFAULT_LABELS = ("10M", "50M", "150M", "400M")


class Block(torch.nn.Module):
    """Pre-norm transformer block's parameters (12 w^2 + 13 w); never run forward here."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)


class GPT(torch.nn.Module):
    """Embedding, ``depth`` blocks, final norm (the head is tied to the embedding)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, config.width)
        self.blocks = torch.nn.ModuleList(Block(config.width) for _ in range(config.depth))
        self.norm = torch.nn.LayerNorm(config.width)


@dataclass(frozen=True)
class Row:
    """One model's measurements (seconds, bytes, 1e9 bytes/s)."""

    label: str
    params: int
    bytes: int
    first_offload_s: float
    offload_s: float
    load_s: float
    warm_s: float
    warm_gb_per_s: float
    bound_d2h_gb_per_s: float
    bound_h2d_gb_per_s: float
    bound_s: float
    fraction_of_memcpy: float
    cold_save_s: float
    cold_load_s: float
    cold_s: float
    page_cache_dropped: bool
    cold_over_warm: float
    cold_load_over_warm_load: float


def parse_count(text: str) -> int:
    """'150M' -> 150_000_000, '1B' -> 1_000_000_000, '5000' -> 5000."""
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}
    suffix = text[-1:].upper()
    if suffix in scale:
        return int(float(text[:-1]) * scale[suffix])
    return int(text)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_job(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> tuple[GPT, torch.optim.Adam]:
    """Model on ``device`` and an Adam whose state exists for every parameter."""
    with torch.device(device):
        model = GPT(config).to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for param in model.parameters():  # one parameter at a time: no full set of grads
        param.grad = torch.full_like(param, 1e-3)
        optimizer.step()
        param.grad = None
    synchronize(device)
    return model, optimizer


def copy_seconds(dst: torch.Tensor, src: torch.Tensor, device: torch.device) -> float:
    best = float("inf")
    for _ in range(3):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def memcpy_bound(nbytes: int, device: torch.device) -> tuple[float, float]:
    """Plain-copy bandwidth (1e9 B/s) device->host and host->device for ``nbytes``."""
    size = min(nbytes, BOUND_CAP_BYTES)
    host = torch.ones(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    on_device = torch.ones(size, dtype=torch.uint8, device=device)
    d2h = size / copy_seconds(host, on_device, device) / 1e9
    h2d = size / copy_seconds(on_device, host, device) / 1e9
    del host, on_device
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return d2h, h2d


def drop_page_cache(folder: Path) -> bool:
    """Ask the kernel to forget the checkpoint's cached pages; True if it accepted."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for name in (TENSORS_FILE, OPTIMIZER_FILE):
        fd = os.open(folder / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def measure(config: ModelConfig, device: torch.device, dtype: torch.dtype, cycles: int, cold_root: Path) -> Row:
    model, optimizer = build_job(config, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    cache = StateCache(budget_bytes=64 * params * dtype.itemsize)
    cache.register(config.label, model, optimizer)

    folder = Path(tempfile.mkdtemp(prefix=f"state-{config.label}-", dir=cold_root))
    try:
        save = cache.save_cold(config.label, folder)
        dropped = drop_page_cache(folder)
        cold_load = cache.load_cold(config.label, folder, device)
    finally:
        shutil.rmtree(folder)

    offloads, loads = [], []
    for _ in range(cycles):
        offloads.append(cache.offload(config.label))
        loads.append(cache.load(config.label, device))
    nbytes = offloads[0].bytes
    del model, optimizer, cache
    if device.type == "cuda":
        torch.cuda.empty_cache()

    d2h, h2d = memcpy_bound(nbytes, device)
    offload_s = statistics.median(r.seconds for r in offloads[1:])
    load_s = statistics.median(r.seconds for r in loads[1:])
    warm_s = offload_s + load_s
    bound_s = nbytes / (d2h * 1e9) + nbytes / (h2d * 1e9)
    cold_s = save.seconds + cold_load.seconds
    return Row(
        label=config.label,
        params=params,
        bytes=nbytes,
        first_offload_s=offloads[0].seconds,
        offload_s=offload_s,
        load_s=load_s,
        warm_s=warm_s,
        warm_gb_per_s=2 * nbytes / warm_s / 1e9,
        bound_d2h_gb_per_s=d2h,
        bound_h2d_gb_per_s=h2d,
        bound_s=bound_s,
        fraction_of_memcpy=bound_s / warm_s,
        cold_save_s=save.seconds,
        cold_load_s=cold_load.seconds,
        cold_s=cold_s,
        page_cache_dropped=dropped,
        cold_over_warm=cold_s / warm_s,
        cold_load_over_warm_load=cold_load.seconds / load_s,
    )


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.machine()} ({torch.get_num_threads()} torch threads)"


def format_table(rows: list[Row]) -> str:
    header = (
        f"{'model':>6} {'params':>8} {'GB':>7} {'1st off':>8} {'offload':>8} {'load':>8} {'warm':>8} "
        f"{'GB/s':>7} {'memcpy':>7} {'of memcpy':>9} {'cold save':>9} {'cold load':>9} "
        f"{'cold':>8} {'cold/warm':>9} {'load c/w':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        bound = 2 * r.bytes / r.bound_s / 1e9
        lines.append(
            f"{r.label:>6} {r.params / 1e6:>7.1f}M {r.bytes / 1e9:>7.2f} {r.first_offload_s:>8.3f} "
            f"{r.offload_s:>8.3f} {r.load_s:>8.3f} {r.warm_s:>8.3f} {r.warm_gb_per_s:>7.2f} {bound:>7.2f} "
            f"{r.fraction_of_memcpy:>9.0%} {r.cold_save_s:>9.2f} {r.cold_load_s:>9.2f} {r.cold_s:>8.2f} "
            f"{r.cold_over_warm:>8.1f}x {r.cold_load_over_warm_load:>7.1f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--full", action="store_true", help="include the 1B model (default on CUDA)")
    parser.add_argument("--max-params", default=None, help="skip models above this size, e.g. 150M")
    parser.add_argument("--cycles", type=int, default=3,
                        help="warm offload+load cycles per model, at least 2 (the first one allocates)")
    parser.add_argument("--cold-dir", default=None, help="folder for cold checkpoints (default: temp)")
    parser.add_argument("--json", default=None, help="also write the rows and the setup here")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 avoids OpenMP stalls on an oversubscribed host)")
    args = parser.parse_args(argv)
    if args.cycles < 2:
        parser.error(f"--cycles {args.cycles}: expected at least 2 (the table takes the cycles after the first)")
    try:
        limit = parse_count(args.max_params) if args.max_params else None
    except (ValueError, OverflowError):
        parser.error(f"--max-params {args.max_params!r}: expected a parameter count such as 150M, 1B or 5000000")
    if limit is not None and limit < parse_count(CONFIGS[0].label):
        parser.error(f"--max-params {args.max_params}: below the smallest model, {CONFIGS[0].label}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads}: expected at least 1")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r}: expected cpu or cuda[:i]")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    labels = {c.label for c in CONFIGS} if args.full or device.type == "cuda" else set(DEFAULT_LABELS)
    configs = [c for c in CONFIGS if c.label in labels and (limit is None or parse_count(c.label) <= limit)]
    cold_root = Path(args.cold_dir or tempfile.gettempdir())
    cold_root.mkdir(parents=True, exist_ok=True)

    print(f"device: {device_name(device)}; torch {torch.__version__}; dtype {args.dtype}; "
          f"state = params + Adam (exp_avg, exp_avg_sq); cycles {args.cycles}", flush=True)
    rows = []
    for config in configs:
        rows.append(measure(config, device, dtype, args.cycles, cold_root))
        print(f"  done {config.label}: warm {rows[-1].warm_s:.3f} s, cold {rows[-1].cold_s:.2f} s", flush=True)
    print(format_table(rows))
    if args.json:
        setup = {
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "device": device_name(device),
            "torch": torch.__version__,
            "dtype": args.dtype,
            "cycles": args.cycles,
        }
        Path(args.json).write_text(json.dumps({"setup": setup, "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
