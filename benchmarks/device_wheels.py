"""Fetch the wheels a GPU machine without a package index needs for the TRL jobs, into .whl/.

The lent GPU machine has torch, transformers, accelerate and most of the scientific stack,
but no Ray, TRL, datasets, pydantic or FastAPI, and it cannot reach a package index: the
wheels travel with the working tree, 64 MiB per call at most. Ray's wheel (79 MB for
CPython 3.12) is too large as it comes; this script rewrites it without what a Python
driver on a local cluster never loads (the Java jars, 31 MB; the dashboard's web build;
RLlib; Ray LLM), about 42 MB, and lists the set's total size.

    python3 benchmarks/device_wheels.py            # then carry .whl (benchmarks/gpu_trl_jobs.sh installs it)

The versions are those the GPU run in docs/integrations.md used. The target is CPython
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
RAY_DROP = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/llm/")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")


def trim_ray(source: Path, target: Path) -> None:
    """Copy the Ray wheel ``source`` to ``target`` without ``RAY_DROP`` (files and their RECORD lines)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(RAY_DROP):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"\n".join(line for line in data.split(b"\n") if not line.decode().startswith(RAY_DROP))
            zout.writestr(info, data)  # the info keeps each file's mode: Ray's binaries stay executable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=Path(".whl"), help="where the wheels go (default .whl)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", args.python_version, "--implementation", "cp", "-d", tmp,
                   *[f"--platform={p}" for p in PLATFORMS], *WHEELS]
        subprocess.run(command, check=True)
        for wheel in Path(tmp).glob("*.whl"):
            if wheel.name.startswith("ray-"):
                trim_ray(wheel, args.dest / wheel.name)
            else:
                wheel.replace(args.dest / wheel.name)
    total = sum(w.stat().st_size for w in args.dest.glob("*.whl"))
    print(f"{len(list(args.dest.glob('*.whl')))} wheels in {args.dest}: {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
