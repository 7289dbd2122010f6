"""The install extras bring what their adapters import (docs/integrations.md's install lines).

``pip install 'rollmux[verl]'`` could not import the veRL adapter (veRL's trainer imports
ray and datasets; neither was in the extra), and ``rollmux[demo]`` lacked the Ray that the
TRL example runs its jobs on: it only worked where ``make install`` put ``[all]``. Here each
extra's entry modules and examples are read (every import statement, also inside
functions, following ``rollmux`` modules), the veRL adapter is also imported in a fresh
interpreter and the veRL modules that loads are read the same way (veRL is installed
without its metadata's dependencies, so what its trainer imports is the list), and every
distribution providing an imported top-level module must
be in the extra's closure: its requirements, with the core dependencies, followed through
the installed packages' own metadata. (Only veRL's own modules are read this way: a library
loads optional packages merely because they are installed, e.g. TRL loads peft.)
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
#: extra -> (modules its users import, example folder, whether to import them too)
ENTRIES = {"demo": (["rollmux.integrations.trl", "rollmux.integrations.trl_jobs"], "examples/trl", False),
           "verl": (["rollmux.integrations.verl"], "examples/verl", True)}
#: installed on its own (`pip install --no-deps verl==0.9.1`: its metadata pins an old transformers)
SEPARATE = {"verl"}


def _closure(extra: str) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [(Requirement(r), set()) for r in project["dependencies"]]
    extras, pending = set(), [extra]
    while pending:
        name = pending.pop()
        extras.add(name)
        for line in project["optional-dependencies"][name]:
            req = Requirement(line)
            if req.name == "rollmux":
                pending += sorted(req.extras - extras)
            else:
                todo.append((req, set(req.extras)))
    seen: set[str] = set()
    while todo:
        req, wanted = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted | {""}):
                todo.append((sub, set(sub.extras)))
    return seen


def _module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``try: ... except ImportError`` (an optional import with a fallback)."""
    while node in parents:
        node, child = parents[node], node
        if isinstance(node, ast.Try) and child in node.body and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            return True
    return False


def _read_imports(files: list[Path]) -> set[str]:
    """Top-level names of every unguarded absolute import in ``files`` and in the rollmux
    modules they import, transitively."""
    roots, done, todo = set(), set(), list(files)
    while todo:
        path = todo.pop()
        if path in done:
            continue
        done.add(path)
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if _guarded(node, parents):
                continue
            for name in names:
                if name.split(".")[0] == "rollmux":
                    found = _module_file(name)
                    if found is not None:
                        todo.append(found)
                else:
                    roots.add(name.split(".")[0])
    return roots


def _separate_files(modules: list[str]) -> list[Path]:
    """The files of the SEPARATE packages' modules that importing ``modules`` loads, in a
    fresh interpreter: their imports are what those packages need of the extra (a
    third-party library's own optional imports are its metadata's business)."""
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(getattr(m, '__file__', None) or '' for n, m in list(sys.modules.items()) "
            f"if n.split('.')[0] in {sorted(SEPARATE)!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [Path(f) for f in json.loads(out.stdout.splitlines()[-1]) if f.endswith(".py")]


@pytest.mark.parametrize("extra", sorted(ENTRIES))
def test_an_extra_brings_every_distribution_its_adapter_imports(extra):
    modules, examples, load = ENTRIES[extra]
    files = [_module_file(m) for m in modules] + sorted((ROOT / examples).glob("*.py"))
    ours = set(sys.stdlib_module_names) | SEPARATE | {"rollmux"}
    read = _read_imports(files) - ours
    imported = read | ((_read_imports(_separate_files(modules)) - ours) if load else set())
    providers = metadata.packages_distributions()
    closure = _closure(extra)
    missing = {name: providers[name] for name in sorted(imported)
               if name in providers and not {canonicalize_name(d) for d in providers[name]} & closure}
    assert not missing, f"rollmux[{extra}] does not install what these imports need: {missing}"
    unknown = sorted(n for n in read if n not in providers)
    assert not unknown, f"imports no installed distribution provides: {unknown}"
