"""benchmarks/device_wheels.py: trimming a wheel and cutting a wheel set into carried parts."""
from __future__ import annotations

import os
import random
import stat
import zipfile
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def wheels(benchmark_script):
    return benchmark_script("device_wheels")


def _blob(path: Path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


def test_split_parts_bounds_every_part_and_chunks_join_back(wheels, tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"big-1.0-py3-none-any.whl": 2500, "a-1.0-py3-none-any.whl": 700, "b-1.0-py3-none-any.whl": 400,
             "c-1.0-py3-none-any.whl": 300, "d-1.0-py3-none-any.whl": 999}
    blobs = {name: _blob(src / name, size, i) for i, (name, size) in enumerate(sizes.items())}
    parts = wheels.split_parts(sorted(src.iterdir()), tmp_path / "out", 1000)
    assert [p.name for p in parts] == [f"part{i}" for i in range(1, len(parts) + 1)]
    for part in parts:
        assert sum(f.stat().st_size for f in part.iterdir()) <= 1000
    assert len(parts) == 5  # 4,900 bytes need at least five parts of 1,000
    files = {f.name: f for part in parts for f in part.iterdir()}
    chunks = sorted(n for n in files if n.startswith("big-1.0-py3-none-any.whl."))
    assert chunks == [f"big-1.0-py3-none-any.whl.{i:03d}" for i in range(3)]
    assert b"".join(files[n].read_bytes() for n in chunks) == blobs["big-1.0-py3-none-any.whl"]
    for name in set(sizes) - {"big-1.0-py3-none-any.whl"}:
        assert files[name].read_bytes() == blobs[name]
    assert not list(src.iterdir())  # every wheel moved or cut


def test_trim_drops_the_paths_and_their_record_lines_and_keeps_modes(wheels, tmp_path: Path):
    source, target = tmp_path / "w-1.0-py3-none-any.whl", tmp_path / "out.whl"
    record = "w/keep.py,sha256=x,1\nw/drop/big.so,sha256=y,2\nw/bin/tool,sha256=z,3\n"
    with zipfile.ZipFile(source, "w") as z:
        z.writestr("w/keep.py", "print(1)")
        z.writestr("w/drop/big.so", b"\0" * 100)
        tool = zipfile.ZipInfo("w/bin/tool")
        tool.external_attr = (stat.S_IFREG | 0o755) << 16
        z.writestr(tool, "#!/bin/sh\n")
        z.writestr("w-1.0.dist-info/RECORD", record)
    wheels.trim(source, target, ("w/drop/",))
    with zipfile.ZipFile(target) as z:
        assert sorted(z.namelist()) == ["w-1.0.dist-info/RECORD", "w/bin/tool", "w/keep.py"]
        assert "big.so" not in z.read("w-1.0.dist-info/RECORD").decode()
        assert (z.getinfo("w/bin/tool").external_attr >> 16) & 0o777 == 0o755
        z.extractall(tmp_path / "x")
    assert os.access(tmp_path / "x" / "w" / "bin" / "tool", os.R_OK)


def test_the_vllm_set_pins_every_wheel_once(wheels):
    names = [w.split("==")[0].replace("_", "-").lower() for w in wheels.VLLM_WHEELS]
    assert len(names) == len(set(names)) and all("==" in w for w in wheels.VLLM_WHEELS)
    assert "vllm" in names and "pydantic" in names
    # the two vLLM jobs' control plane runs on Ray; its wheel travels trimmed, as in the TRL set
    assert "ray" in names and wheels.SETS["vllm"][1]["ray-"] == wheels.RAY_DROP
    # vLLM 0.24.0 pins apache-tvm-ffi 0.1.9; xgrammar releases after 0.2.5.post1 need a later one
    pins = dict(w.split("==") for w in wheels.VLLM_WHEELS)
    assert pins["apache-tvm-ffi"] == "0.1.9" and pins["xgrammar"] == "0.2.5.post1"
