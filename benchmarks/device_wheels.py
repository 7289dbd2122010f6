"""Fetch the wheels a GPU machine without a package index needs, into .whl/ (or parts of .wv/).

The lent GPU machine has torch, transformers, accelerate and most of the scientific stack,
but no Ray, TRL, datasets, pydantic, FastAPI or vLLM, and it cannot reach a package
index: the wheels travel with the working tree, 64 MiB per call at most.

* ``--set trl`` (default): the TRL jobs' wheels. Ray's wheel (79 MB for CPython 3.12) is
  rewritten without what a Python driver on a local cluster never loads (the Java jars,
  31 MB; the dashboard's web build; RLlib; Ray LLM), about 42 MB.
* ``--set vllm``: vLLM 0.24.0 (it pins the machine's torch 2.11.0; its kernels link CUDA
  13, as that torch does), the requirements the machine lacks, Ray (trimmed as above:
  the two vLLM jobs' control plane) and the control plane's wheels. ``xgrammar`` is
  0.2.5.post1: vLLM pins ``apache-tvm-ffi==0.1.9``, which later xgrammar releases cannot
  load with. vLLM's wheel (279 MB) is rewritten without the FlashAttention-2 kernels (the
  H100/H200 run FlashAttention-3), the fused-MoE kernels (dense models only), the Rust
  front end binary and the CUTLASS headers of its JIT kernels: about 135 MB. The
  set (about 262 MB) is then cut into ``--parts`` folders ``part1``... of at most
  ``--part-mb`` MB, each carried by one call to the same warm machine; a wheel larger
  than a part travels as byte chunks ``NAME.whl.000``... that ``benchmarks/gpu_vllm.sh``
  joins again.

    python3 benchmarks/device_wheels.py                          # carry .whl (benchmarks/gpu_trl_jobs.sh)
    python3 benchmarks/device_wheels.py --set vllm --dest .wv    # carry .wv/part1 ... part5 in turn

The versions are those the GPU runs in docs/integrations.md used. The target is CPython
3.12 on x86-64 Linux (the lent machine's Python).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEELS = ("ray==2.60.0", "pydantic==2.14.4", "pydantic_core==2.50.5", "fastapi==0.165.0", "starlette==1.10.0",
          "uvicorn==0.54.0", "opentelemetry-api==1.45.2", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
          "referencing==0.37.0", "rpds-py==2026.9.1", "tenacity==9.2.1", "annotated-types==0.8.0",
          "typing-inspection==0.4.5", "trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19")
# what the control plane needs, of the TRL set (not Ray, TRL, datasets and theirs)
CONTROL_PLANE = tuple(w for w in WHEELS if not w.startswith(("ray==", "trl==", "datasets==", "dill==", "multiprocess==")))
VLLM_WHEELS = ("vllm==0.24.0", "apache-tvm-ffi==0.1.9", "astor==0.8.1", "blake3==1.0.11", "cachetools==8.0.2",
               "cbor2==6.3.0", "compressed-tensors==0.17.0", "depyf==0.20.0", "diskcache==5.6.3", "distro==1.9.0",
               "gguf==0.19.0", "ijson==3.6.0", "interegular==0.3.3", "jiter==0.19.0", "lark==1.2.2",
               "llguidance==1.7.6", "lm-format-enforcer==0.11.3", "loguru==0.7.3", "mistral-common==1.13.1",
               "msgspec==0.22.0", "openai==2.54.0", "openai-harmony==0.0.8", "outlines-core==0.2.14",
               "partial-json-parser==0.2.1.1.post7", "prometheus-fastapi-instrumentator==8.1.0", "pybase64==1.5.1",
               "pycountry==26.2.16", "pydantic-extra-types==2.11.1", "python-json-logger==4.2.0", "pyzmq==27.3.0",
               "setproctitle==1.3.8", "sniffio==1.3.1", "watchfiles==1.3.0", "xgrammar==0.2.5.post1", "dill==0.4.1",
               "ray==2.60.0", *CONTROL_PLANE)
RAY_DROP = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/llm/")
VLLM_DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C", "vllm/_moe_C", "vllm/vllm-rs", "vllm/third_party/fmha_sm100/cutlass/include/",
             "vllm/third_party/deep_gemm/include/", *(f"vllm/third_party/deep_gemm/_C.cpython-3{v}" for v in (10, 11, 13, 14)))
SETS = {"trl": (WHEELS, {"ray-": RAY_DROP}), "vllm": (VLLM_WHEELS, {"vllm-": VLLM_DROP, "ray-": RAY_DROP})}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64", "any")


def trim(source: Path, target: Path, drop: tuple[str, ...]) -> None:
    """Copy the wheel ``source`` to ``target`` without the paths starting with ``drop`` (files and RECORD lines)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(drop):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"\n".join(line for line in data.split(b"\n") if not line.decode().startswith(drop))
            zout.writestr(info, data)  # the info keeps each file's mode: binaries stay executable


def split_parts(wheels: list[Path], dest: Path, part_bytes: int) -> list[Path]:
    """Move ``wheels`` into ``dest/part1``, ``part2``... of at most ``part_bytes`` each, largest
    first into the first part with room; a wheel larger than a part is cut into byte chunks
    ``NAME.000``, ``NAME.001``... (``cat NAME.* > NAME`` joins them). Returns the parts."""
    parts: list[list[int | Path]] = []  # [bytes used, folder]

    def room(size: int) -> Path:
        for part in parts:
            if part[0] + size <= part_bytes:
                part[0] += size
                return part[1]
        folder = dest / f"part{len(parts) + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        parts.append([size, folder])
        return folder

    for wheel in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = wheel.stat().st_size
        if size <= part_bytes:
            wheel.replace(room(size) / wheel.name)
            continue
        with wheel.open("rb") as f:
            for i, chunk in enumerate(iter(lambda: f.read(part_bytes), b"")):
                (room(len(chunk)) / f"{wheel.name}.{i:03d}").write_bytes(chunk)
        wheel.unlink()
    return [part[1] for part in parts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), default="trl", help="which run's wheels (default trl)")
    parser.add_argument("--dest", type=Path, default=Path(".whl"), help="where the wheels go (default .whl)")
    parser.add_argument("--part-mb", type=float, default=58.0,
                        help="--set vllm: MB per carried part (default 58: the tree itself travels too)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    args = parser.parse_args()
    wheels, trims = SETS[args.set]
    args.dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", args.python_version, "--implementation", "cp", "-d", tmp,
                   *[f"--platform={p}" for p in PLATFORMS], *wheels]
        subprocess.run(command, check=True)
        staged = Path(tmp) / "staged"
        staged.mkdir()
        for wheel in Path(tmp).glob("*.whl"):
            drop = next((d for prefix, d in trims.items() if wheel.name.startswith(prefix)), None)
            if drop:
                trim(wheel, staged / wheel.name, drop)
            else:
                wheel.replace(staged / wheel.name)
        fetched = sorted(staged.glob("*.whl"))
        total = sum(w.stat().st_size for w in fetched)
        if args.set == "trl":
            for wheel in fetched:
                wheel.replace(args.dest / wheel.name)
            print(f"{len(fetched)} wheels in {args.dest}: {total / 2**20:.1f} MiB")
            return 0
        parts = split_parts(fetched, args.dest, int(args.part_mb * 1e6))
    print(f"{len(fetched)} wheels, {total / 1e6:.1f} MB, in {len(parts)} parts: "
          + ", ".join(f"{p} ({sum(f.stat().st_size for f in p.iterdir()) / 1e6:.1f} MB)" for p in parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
