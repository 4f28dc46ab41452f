"""Run import-linter's contracts ([tool.importlinter] in pyproject.toml) over the package.

The four top folders are namespace portions of ``posttrain`` (DESIGN.md: an ``__init__.py`` in ``platform/`` would
shadow the standard library's ``platform``), and grimp, import-linter's graph builder, walks only folders that are
regular packages. So the package's Python files are mirrored into ``build/imports/posttrain`` with an empty
``__init__.py`` wherever a folder has none, and ``lint-imports`` reads the mirror. ``make test`` runs this first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("platform", "training", "preprocess", "ui")


def mirror(dest: Path) -> Path:
    """The package's modules under ``dest/posttrain``, every folder a regular package; returns ``dest``."""
    package = dest / "posttrain"
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir(parents=True)
    shutil.copy2(ROOT / "__init__.py", package / "__init__.py")
    for folder in FOLDERS:
        for source in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in source.parts:
                continue
            target = package / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for directory in [package, *(p for p in package.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    return dest


def lint(dest: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the mirror in ``dest``, its report captured."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(dest), os.environ.get("PYTHONPATH")) if p)}
    lint = Path(sys.executable).with_name("lint-imports")
    command = [str(lint), "--no-cache", str(ROOT / "pyproject.toml")]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


# The one import cycle the package keeps on purpose: the verifier kinds register themselves in the registry, which
# imports the kinds package to load the built-in ones (a plugin registry).
DECLARED_CYCLES = [{"posttrain.platform.verifiers.registry", "posttrain.platform.verifiers.kinds"}]


def cycles(dest: Path) -> list[set[str]]:
    """The import cycles of the mirrored package in ``dest``: each strongly connected set of modules (Tarjan's
    algorithm over grimp's graph), the declared plugin registry's included."""
    code = (
        "import json, sys, grimp\n"
        "g = grimp.build_graph('posttrain')\n"
        "index, low, stack, on, found = {}, {}, [], set(), []\n"
        "sys.setrecursionlimit(100000)\n"
        "def visit(v):\n"
        "    index[v] = low[v] = len(index); stack.append(v); on.add(v)\n"
        "    for w in g.find_modules_directly_imported_by(v):\n"
        "        if w not in index:\n"
        "            visit(w); low[v] = min(low[v], low[w])\n"
        "        elif w in on:\n"
        "            low[v] = min(low[v], index[w])\n"
        "    if low[v] == index[v]:\n"
        "        part = []\n"
        "        while True:\n"
        "            w = stack.pop(); on.discard(w); part.append(w)\n"
        "            if w == v: break\n"
        "        if len(part) > 1: found.append(sorted(part))\n"
        "for m in sorted(g.modules):\n"
        "    if m not in index: visit(m)\n"
        "print(json.dumps(found))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(dest)}
    done = subprocess.run([sys.executable, "-c", code], cwd=dest, env=env, capture_output=True, text=True, check=True)
    return [set(part) for part in json.loads(done.stdout)]


def undeclared(found: list[set[str]]) -> list[set[str]]:
    """The cycles in ``found`` that are not the declared plugin registry's (its modules and the kinds under it)."""

    def declared(part: set[str]) -> bool:
        return any(all(any(m == d or m.startswith(d + ".") for d in names) for m in part) for names in DECLARED_CYCLES)

    return [part for part in found if not declared(part)]


def main() -> int:
    dest = mirror(ROOT / "build" / "imports")
    done = lint(dest)
    print(done.stdout, done.stderr, sep="", end="")
    left = undeclared(cycles(dest))
    for part in left:
        print(f"import cycle: {' <-> '.join(sorted(part))}")
    return done.returncode or (1 if left else 0)


if __name__ == "__main__":
    raise SystemExit(main())
