"""A missing required part fails the run: a small suite run with this suite's hooks, in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

SUITE = """
import shutil

import pytest

from required_parts import require


def test_passes():
    assert 1 + 1 == 2


def test_skips_for_bubblewrap():
    if shutil.which("no-such-bwrap") is None:
        pytest.skip("bubblewrap is not installed (make system-deps)")


@pytest.mark.skipif(True, reason="Tesseract is missing")
def test_skipif_for_tesseract():
    pass


def test_skips_for_another_reason():
    pytest.skip("only on a GPU")


@pytest.mark.requires("bubblewrap")
def test_marked_as_needing_bubblewrap():
    pass


def test_requires_tesseract_in_its_body():
    require("tesseract")
"""


CONFTEST = """
from required_parts import (  # noqa: F401
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
"""


def run_suite(
    tmp_path: Path, suite: str, env: dict[str, str] | None = None, name: str = "test_small.py"
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the small suite's own root, not this repository's
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / name).write_text(textwrap.dedent(suite))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS_DIR), **(env or {})},
    )  # fmt: skip


def test_a_skip_for_a_missing_part_fails_the_run(tmp_path: Path) -> None:
    # A PATH without bwrap or tesseract: both look missing to the small suite.
    empty = tmp_path / "bin"
    empty.mkdir()
    run = run_suite(tmp_path, SUITE, env={"PATH": str(empty)})
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, out
    # The plain skip and the skipif naming a part fail; so do the marked test and require() in a body.
    assert "FAILED test_small.py::test_skips_for_bubblewrap" in out, out
    assert "ERROR test_small.py::test_skipif_for_tesseract" in out, out
    assert "ERROR test_small.py::test_marked_as_needing_bubblewrap" in out, out
    assert "FAILED test_small.py::test_requires_tesseract_in_its_body" in out, out
    # A skip for another reason stays a skip; a passing test passes.
    assert "SKIPPED [1] test_small.py:" in out and "only on a GPU" in out, out
    assert "PASSED test_small.py::test_passes" in out, out
    # The summary names each part with its install command.
    assert "required parts missing" in out, out
    assert (
        "bubblewrap: 2 test(s) failed without it; install it: apt-get install bubblewrap (or make system-deps)" in out
    ), out
    assert (
        "tesseract: 2 test(s) failed without it; install it: apt-get install tesseract-ocr tesseract-ocr-eng" in out
    ), out
    assert ("bubblewrap is required and missing (the test skipped: bubblewrap is not installed (make system-deps)); "
            "install it: apt-get install bubblewrap") in out, out  # fmt: skip
    assert (
        "tesseract is required and missing (`tesseract` is not on PATH); install it: apt-get install tesseract-ocr"
        in out
    ), out
    assert (
        "bubblewrap is required and missing (`bwrap` is not on PATH); install it: apt-get install bubblewrap" in out
    ), out


def test_a_suite_with_only_other_skips_passes(tmp_path: Path) -> None:
    run = run_suite(
        tmp_path,
        """
        import pytest

        def test_passes():
            pass

        def test_skips_for_another_reason():
            pytest.skip("only on a GPU")
    """,
    )
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.OK, out
    assert "1 passed, 1 skipped" in out and "required parts missing" not in out, out


def test_a_module_skipped_for_a_missing_package_stops_the_run(tmp_path: Path) -> None:
    run = run_suite(
        tmp_path,
        """
        import pytest

        pytest.importorskip("ray_is_not_this")  # a plain missing module: still a skip
        """,
        name="test_other.py",
    )
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.NO_TESTS_COLLECTED and "1 skipped" in out, out
    run = run_suite(
        tmp_path,
        """
        import pytest

        pytest.skip("could not import 'ray': No module named 'ray'", allow_module_level=True)  # what importorskip says
        """,
    )
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "ERROR test_small.py" in out and "ray is required and missing" in out, out
    assert 'install it: .venv/bin/pip install -e ".[dev]" (or make venv)' in out, out
