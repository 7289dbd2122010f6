"""The compiled kernel (``rollmux.native``): the build that runs is the build of today's
source, a stale or missing build leaves the source running, and the compiled and pure
kernels give the same answers, bit for bit."""
from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollmux import kernel, native

HERE = Path(__file__).resolve().parent


def _can_build() -> bool:
    return importlib.util.find_spec("mypyc") is not None and shutil.which(os.environ.get("CC", "cc")) is not None


def random_keys(count: int, seed: int) -> list[tuple]:
    """Synchronous memo keys of 1-5 members over a few nodes: shared and private nodes,
    phases of zero and of less than a tick, switch seconds or none."""
    rng = random.Random(seed)
    keys = []
    for _ in range(count):
        n = rng.randint(1, 5)
        rows = []
        for _ in range(n):
            roll = tuple(sorted(rng.sample(range(3), rng.randint(1, 2))))
            train = tuple(sorted(rng.sample(range(3, 6), rng.randint(1, 2))))
            durations = [rng.choice((0.0, 1e-7, round(rng.uniform(1, 300), 3))) if rng.random() < 0.05
                         else round(rng.uniform(1, 300), 3) for _ in range(2)]
            switch = [round(rng.uniform(0, 10), 3) if rng.random() < 0.5 else 0.0 for _ in range(2)]
            rows.append((durations[0], durations[1], roll, train, switch[0], switch[1]))
        # nodes renamed by first use, as intra.sync_key numbers them
        rename: dict[int, int] = {}
        keys.append(tuple((r[0], r[1], tuple(rename.setdefault(x, len(rename)) for x in r[2]),
                           tuple(rename.setdefault(x, len(rename)) for x in r[3]), r[4], r[5]) for r in rows))
    return keys


def answers(count: int = 120, seed: int = 7) -> str:
    """Every entry point of the kernel on ``random_keys``, as one exact text (reprs of
    floats are exact)."""
    out = []
    for key in random_keys(count, seed):
        out.append(repr(kernel.shape_of(key)))
        out.append(repr(kernel.worst_iterations(key, len(key) <= 3, None)))
        out.append(repr(kernel.peer_floors(key)))
    return "\n".join(out)


def test_the_package_imports_the_build_of_todays_source():
    """Where the kernel can be built (mypyc and a C compiler), `make install` and `make
    test` build it, and the package imports it: the latency figures in the docs are its."""
    if os.environ.get(native.PURE_ENV):
        pytest.skip(f"{native.PURE_ENV} is set")
    if not _can_build():
        pytest.skip("no mypyc or no C compiler here: the source runs")
    shim, why = native.compiled_path()
    assert shim is not None, f"{why}: make install (or rollmux kernel build) builds it"
    assert Path(kernel.__file__) == shim
    assert native.status() == "compiled with mypyc"


def test_compiled_and_pure_kernels_agree():
    if not str(kernel.__file__).endswith(native.SUFFIX):
        pytest.skip(f"the source runs here ({native.status()})")
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); from test_native import answers; print(answers())"
    env = dict(os.environ, **{native.PURE_ENV: "1"})
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.rstrip("\n") == answers()


@pytest.fixture
def build_dir(tmp_path, monkeypatch):
    """``rollmux.native`` pointed at a copy of the source in a scratch package folder."""
    source = tmp_path / "kernel.py"
    source.write_bytes(native.SOURCE.read_bytes())
    out = tmp_path / "_native"
    monkeypatch.setattr(native, "SOURCE", source)
    monkeypatch.setattr(native, "PACKAGE", tmp_path)
    monkeypatch.setattr(native, "OUT", out)
    monkeypatch.setattr(native, "RECORD", out / "kernel.sha256")
    monkeypatch.setattr(native, "SHIM", out / f"kernel{native.SUFFIX}")
    monkeypatch.setattr(native, "LIB", tmp_path / f"kernel__mypyc{native.SUFFIX}")
    csim = tmp_path / "_csim.c"
    csim.write_bytes(native.CSIM_SOURCE.read_bytes())
    monkeypatch.setattr(native, "CSIM_SOURCE", csim)
    monkeypatch.setattr(native, "CSIM", out / f"_csim{native.SUFFIX}")
    monkeypatch.setattr(native, "CSIM_RECORD", out / "csim.sha256")
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    return tmp_path


def test_the_source_runs_unless_the_build_matches_it(build_dir, monkeypatch):
    assert native.compiled_path() == (None, "not built (rollmux kernel build)")
    native.OUT.mkdir()
    native.RECORD.write_text(native.digest() + "\n")
    assert native.compiled_path()[0] is None and "not built for this interpreter" in native.compiled_path()[1]
    native.SHIM.write_bytes(b"")
    assert native.compiled_path()[0] is None  # the shim without its code
    native.LIB.write_bytes(b"")
    assert native.compiled_path() == (native.SHIM, "compiled with mypyc")
    native.SOURCE.write_text(native.SOURCE.read_text() + "\n# an edit\n")
    assert native.compiled_path() == (None, "kernel.py changed since the build (rollmux kernel build)")
    native.RECORD.write_text(native.digest() + "\n")
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.compiled_path() == (None, f"{native.PURE_ENV} is set")


def test_the_kernel_loop_runs_unless_the_c_build_matches_its_source(build_dir, monkeypatch):
    assert native.simulator_path() == (None, "not built (rollmux kernel build)")
    assert native.simulator() is None
    native.OUT.mkdir()
    native.CSIM_RECORD.write_text(native.digest(native.CSIM_SOURCE) + "\n")
    assert "not built for this interpreter" in native.simulator_path()[1]
    native.CSIM.write_bytes(b"")
    assert native.simulator_path() == (native.CSIM, "C")
    native.CSIM_SOURCE.write_text(native.CSIM_SOURCE.read_text() + "\n/* an edit */\n")
    assert native.simulator_path() == (None, "_csim.c changed since the build (rollmux kernel build)")
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.simulator_path() == (None, f"{native.PURE_ENV} is set")


def test_the_c_loop_builds_loads_and_a_failed_build_leaves_no_record(build_dir):
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here")
    path = native.build_simulator()
    assert path == native.CSIM and native.simulator_path() == (path, "C")
    assert callable(native.simulator().simulate)
    native.CSIM_SOURCE.write_text(native.CSIM_SOURCE.read_text() + "\nthis is not C;\n")
    with pytest.raises(native.BuildError, match="did not build"):
        native.build_simulator()
    assert not native.CSIM_RECORD.exists() and native.simulator() is None


def test_the_package_runs_the_c_loop_where_it_can_be_built():
    if os.environ.get(native.PURE_ENV):
        pytest.skip(f"{native.PURE_ENV} is set")
    if not _can_build():
        pytest.skip("no mypyc or no C compiler here: the kernel's loop runs")
    assert native.simulator_status() == "C", "make install (or rollmux kernel build) builds it"


def test_a_failed_build_leaves_no_record(build_dir):
    if not _can_build():
        pytest.skip("no mypyc or no C compiler here")
    native.OUT.mkdir()
    native.RECORD.write_text(native.digest() + "\n")  # an earlier build's record
    native.SOURCE.write_text(native.SOURCE.read_text() + "\nMAX_ITERATIONS = 'sixty'\n")  # a type error
    with pytest.raises(native.BuildError, match="mypyc exited"):
        native.build()
    assert not native.RECORD.exists()
    assert native.compiled_path()[0] is None


def test_the_speed_benchmark_runs_and_compares_answers():
    """``benchmarks/kernel_speed.py`` (short): both kernels answer alike, a row per entry point."""
    script = HERE.parent / "benchmarks" / "kernel_speed.py"
    run = subprocess.run([sys.executable, str(script), "--groups", "12", "--rounds", "1"], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith(("shape_of", "worst_iterations"))]
    assert [r[0] for r in rows] == ["shape_of", "worst_iterations"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and float(r[3]) > 0 and r[4].endswith("x") and r[5].endswith("x")
               for r in rows)
