"""Run import-linter's contracts ([tool.importlinter] in pyproject.toml) over the package.

The four top folders are namespace portions of ``posttrain`` (DESIGN.md: an ``__init__.py`` in ``platform/`` would
shadow the standard library's ``platform``), and grimp, import-linter's graph builder, walks only folders that are
regular packages. So the package's Python files are mirrored into ``build/imports/posttrain`` with an empty
``__init__.py`` wherever a folder has none, and ``lint-imports`` reads the mirror. ``make test`` runs this first."""

from __future__ import annotations

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


def main() -> int:
    done = lint(mirror(ROOT / "build" / "imports"))
    print(done.stdout, done.stderr, sep="", end="")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
