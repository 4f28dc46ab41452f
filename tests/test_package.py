"""The package layout docs/architecture.md describes, checked rather than trusted."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import REPO_ROOT

CODE_FOLDERS = ("platform", "preprocess", "training", "ui")


def test_stdlib_platform_and_torch_import_in_repo_root() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import platform, torch; print(platform.system())"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "Linux"


def test_platform_folder_has_no_init() -> None:
    for folder in CODE_FOLDERS:
        assert not (REPO_ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py must not exist"


def test_packages_list_names_every_python_folder() -> None:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    needed = {"posttrain"}
    for py in REPO_ROOT.rglob("*.py"):
        rel = py.parent.relative_to(REPO_ROOT)
        if rel.parts and rel.parts[0] in CODE_FOLDERS and "__pycache__" not in rel.parts:
            needed.add(".".join(("posttrain", *rel.parts)))
    missing = sorted(needed - listed)
    assert not missing, f"pyproject [tool.setuptools] packages misses {missing}"
    stale = sorted(p for p in listed - needed if not (REPO_ROOT / Path(*p.split(".")[1:])).is_dir())
    assert not stale, f"pyproject lists packages with no folder: {stale}"


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "posttrain"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True)
    assert "jobs" in out.stdout and "worker" in out.stdout
