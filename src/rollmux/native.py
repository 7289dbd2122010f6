"""The compiled kernel: mypyc's build of ``rollmux.kernel``, imported in its place while
it was built from the source as it is now.

Contract. ``build()`` compiles ``kernel.py`` with mypyc (mypy is in the ``native`` extra,
and a C compiler is needed) into two extension modules: the shim
``_native/kernel<suffix>``, which Python imports as ``rollmux.kernel``, and its code,
``kernel__mypyc<suffix>``, next to the package's modules (the shim imports it as
``rollmux.kernel__mypyc``). It then records the SHA-256 of the source it compiled in
``_native/kernel.sha256``; a build that fails leaves no record. ``install()`` (run by
``import rollmux``) puts an import finder in front of the others that hands out the shim
for ``rollmux.kernel`` when the record matches today's ``kernel.py``. Otherwise, or
with ``ROLLMUX_PURE_PYTHON`` set, nothing changes and Python imports the source: an
edit of ``kernel.py`` is never shadowed by an older build, and a machine without a
compiler runs the same code, slower. ``status()`` says which one runs and why.

The shim is kept out of the package directory on purpose: a ``kernel<suffix>`` beside
``kernel.py`` would be imported before it by Python's own finder, fresh or not.

The simulation loop in C. ``build()`` then compiles ``_csim.c`` (the loop of
``kernel._simulate``, in machine words) into ``_native/_csim<suffix>`` with setuptools
and records its source's SHA-256 in ``_native/csim.sha256``. ``simulator()`` (called by
``rollmux.kernel`` at import, compiled or not) loads it when the record matches
today's ``_csim.c`` and ``ROLLMUX_PURE_PYTHON`` is unset, else returns None and the
kernel runs its own loop; ``simulator_status()`` says which and why.

    rollmux kernel build     # make install runs it; never needed for correctness
    rollmux kernel status
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SOURCE = PACKAGE / "kernel.py"
OUT = PACKAGE / "_native"
RECORD = OUT / "kernel.sha256"
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
SHIM = OUT / f"kernel{SUFFIX}"
LIB = PACKAGE / f"kernel__mypyc{SUFFIX}"
MODULE = "rollmux.kernel"
PURE_ENV = "ROLLMUX_PURE_PYTHON"
CSIM_SOURCE = PACKAGE / "_csim.c"
CSIM = OUT / f"_csim{SUFFIX}"
CSIM_RECORD = OUT / "csim.sha256"
_SETUP = ("from setuptools import Extension, setup; setup(name='rollmux-csim', script_args=['-q', 'build_ext', "
          "'--inplace'], ext_modules=[Extension('_csim', ['_csim.c'], extra_compile_args=['-O2'])])")


class BuildError(RuntimeError):
    """mypyc could not compile the kernel (its output is the message)."""


def digest(source: Path | None = None) -> str:
    """The SHA-256 of ``source`` (default ``kernel.py``) as it is now."""
    return hashlib.sha256((source or SOURCE).read_bytes()).hexdigest()


def _stale(record: Path, built: tuple[Path, ...], source: Path) -> str | None:
    """Why the build recorded in ``record`` must not run (None when it may): the opt-out
    set, no record, a file of it missing, or ``source`` edited since."""
    if os.environ.get(PURE_ENV):
        return f"{PURE_ENV} is set"
    try:
        recorded = record.read_text().strip()
    except OSError:
        return "not built (rollmux kernel build)"
    if not all(path.exists() for path in built):
        return f"not built for this interpreter ({SUFFIX})"
    if recorded != digest(source):
        return f"{source.name} changed since the build (rollmux kernel build)"
    return None


def compiled_path() -> tuple[Path | None, str]:
    """The shim to import for ``rollmux.kernel``, or None and why the source runs."""
    why = _stale(RECORD, (SHIM, LIB), SOURCE)
    return (None, why) if why else (SHIM, "compiled with mypyc")


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, shim: Path):
        self.shim = shim

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        return importlib.util.spec_from_file_location(name, self.shim)


def install() -> None:
    """Import the compiled kernel for ``rollmux.kernel`` from now on, when it is fresh."""
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    shim, _ = compiled_path()
    if shim is not None:
        sys.meta_path.insert(0, _Finder(shim))


def status() -> str:
    """Which kernel this process runs: "compiled with mypyc", or "pure Python (why)"."""
    from rollmux import kernel

    if str(getattr(kernel, "__file__", "")).endswith(SUFFIX):
        return "compiled with mypyc"
    return f"pure Python ({compiled_path()[1]})"


def simulator_path() -> tuple[Path | None, str]:
    """The C simulation loop to load, or None and why the kernel runs its own."""
    why = _stale(CSIM_RECORD, (CSIM,), CSIM_SOURCE)
    return (None, why) if why else (CSIM, "C")


def simulator():
    """The C simulation loop's module (``rollmux._csim``), or None where it is not fresh."""
    path, _ = simulator_path()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("rollmux._csim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def simulator_status() -> str:
    """Which simulation loop the kernel runs: "C", or "the kernel's own (why)"."""
    from rollmux import kernel

    if kernel._csim is not None:
        return "C"
    return f"the kernel's own ({simulator_path()[1]})"


def build_simulator() -> Path:
    """Compile ``_csim.c`` (see the contract); returns the extension's path."""
    import shutil
    import subprocess
    import tempfile

    source = CSIM_SOURCE.read_bytes()
    CSIM_RECORD.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="rollmux-csim-") as tmp:
        Path(tmp, "_csim.c").write_bytes(source)
        run = subprocess.run([sys.executable, "-c", _SETUP], cwd=tmp, capture_output=True, text=True)
        built = Path(tmp, f"_csim{SUFFIX}")
        if run.returncode or not built.exists():
            raise BuildError(f"the C simulation loop did not build (exit {run.returncode}):\n"
                             f"{(run.stdout + run.stderr)[-4000:]}")
        OUT.mkdir(exist_ok=True)
        staged = CSIM.with_name(CSIM.name + ".new")
        shutil.copyfile(built, staged)
        os.replace(staged, CSIM)
    CSIM_RECORD.write_text(hashlib.sha256(source).hexdigest() + "\n")
    return CSIM


def build() -> Path:
    """Compile ``kernel.py``, then the C simulation loop (see the contract); returns the shim's path."""
    import shutil  # here, not at ``import rollmux``, which only looks for a build
    import subprocess
    import tempfile

    source = SOURCE.read_bytes()
    RECORD.unlink(missing_ok=True)  # no record while the files change
    with tempfile.TemporaryDirectory(prefix="rollmux-native-") as tmp:
        package = Path(tmp, "rollmux")
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "kernel.py").write_bytes(source)
        run = subprocess.run([sys.executable, "-m", "mypyc", "--follow-imports=skip", "--ignore-missing-imports",
                              "rollmux/kernel.py"], cwd=tmp, capture_output=True, text=True)
        built = sorted(package.glob(f"*{SUFFIX}"))
        shim = package / f"kernel{SUFFIX}"
        if run.returncode or shim not in built or package / LIB.name not in built:
            raise BuildError(f"mypyc exited {run.returncode}:\n{(run.stdout + run.stderr)[-4000:]}")
        OUT.mkdir(exist_ok=True)
        for path in built:  # a new file renamed into place: a process may have the old one mapped
            target = SHIM if path == shim else PACKAGE / path.name
            staged = target.with_name(target.name + ".new")
            shutil.copyfile(path, staged)
            os.replace(staged, target)
    RECORD.write_text(hashlib.sha256(source).hexdigest() + "\n")
    build_simulator()
    return SHIM
