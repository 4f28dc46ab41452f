"""A warm pool of sandboxes.

Example::

    pool = SandboxPool(SandboxConfig(pool_size=4), data_dir=Path("var"))
    with pool.acquire() as sandbox:        # milliseconds: the sandbox is already running
        sandbox.run_python("x = 2")
        result = sandbox.run_python("x * 21")   # globals persist within the episode
        assert result.value == "42"
    pool.close()                           # or use the pool as a context manager

Releasing a sandbox ends its episode: a maintenance thread kills every
process in it, wipes its work directory and /tmp, and forks a fresh
interpreter, then puts it back. A sandbox that died is started anew.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import stat
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from posttrain.platform.sandbox import _server, workdir
from posttrain.platform.sandbox.backends import (
    SandboxUnavailableError,
    bwrap_path,
    python_prefixes,
    run_as,
    warn_if_weak,
)
from posttrain.platform.sandbox.limits import confinement
from posttrain.platform.sandbox.result import CallRecord, CallStatus, PoolStatus, ToolResult
from posttrain.platform.sandbox.sandbox import Sandbox, SandboxStartError
from posttrain.platform.settings.sandbox import SandboxConfig

MAX_RESTART_DELAY_S = 30.0
POOL_PREFIXES = ("pool-", "posttrain-sandboxes-")  # <prefix><pid>-<random>: under a root, under the temp dir


class PoolExhaustedError(TimeoutError):
    """No sandbox became free within the acquire timeout."""


class PoolClosedError(RuntimeError):
    pass


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class SandboxPool:
    """Pre-started sandboxes for one process; thread-safe."""

    def __init__(self, config: SandboxConfig, data_dir: Path | None = None, *, start: bool = True) -> None:
        if config.backend == "ray":
            raise SandboxUnavailableError("backend 'ray' is served by RayPool, not SandboxPool")
        if config.backend == "bwrap":
            bwrap_path()
        python_prefixes(config.python_executable)
        warn_if_weak(config)
        self.config = config
        self._limits = dict(confinement(config).limits)  # found out (and any fallback logged) once
        self._root = config.resolved_root(data_dir)
        self._dir = self._make_dir()
        self._server = self._dir / "server.py"
        shutil.copyfile(_server.__file__, self._server)
        self._server.chmod(0o644)
        for name in _server.BESIDE:  # the framing, and the code grader the zygote preloads for every episode
            beside = self._server.with_name(name)
            shutil.copyfile(Path(_server.__file__).with_name(name), beside)
            beside.chmod(0o644)
        self._slots = [
            Sandbox(config, i, self._dir / f"slot-{i}", self._server, on_call=self._record_call)
            for i in range(config.pool_size)
        ]
        self._ready: deque[Sandbox] = deque()
        self._busy: set[int] = set()
        self._cond = threading.Condition()
        self._tasks: queue.Queue[tuple[str, Sandbox] | None] = queue.Queue()
        self._calls: deque[CallRecord] = deque(maxlen=config.latency_history)
        self._acquire_ms: deque[float] = deque(maxlen=config.latency_history)
        self._failures = 0
        self._infra = 0
        self._episodes = 0
        self._ncalls = 0
        self._last_error = ""
        self._restart_delay: dict[int, float] = {}
        self._closed = False
        self._threads: list[threading.Thread] = []
        if start:
            self.start()

    # ------------------------------------------------------------ life cycle
    def start(self, wait: bool = True) -> None:
        """Start the maintenance threads and every sandbox; with ``wait``, block until all
        are ready (raises SandboxStartError if none could start)."""
        if self._threads:
            return
        # Sandboxes die with the thread that started them (--die-with-parent), so they are
        # started only from these threads, which live as long as the pool.
        for i in range(min(2, self.config.pool_size)):
            thread = threading.Thread(target=self._maintain, name=f"sandbox-pool-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for sandbox in self._slots:
            self._tasks.put(("start", sandbox))
        if wait and not self.wait_ready(self.config.start_timeout_s * self.config.pool_size):
            raise SandboxStartError(f"sandbox pool did not fill: {self._last_error or 'timed out'}")

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until every slot is idle and warm (or the timeout passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < len(self._slots):
                if self._closed:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        """Kill every sandbox and remove the pool's directory."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
        for sandbox in self._slots:
            sandbox.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- leasing
    @contextlib.contextmanager
    def acquire(self, timeout: float | None = None) -> Iterator[Sandbox]:
        """Lend a warm sandbox for one episode; leaving the block ends the episode."""
        sandbox = self.checkout(timeout)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    def checkout(self, timeout: float | None = None) -> Sandbox:
        """Take a warm sandbox; pair with ``release``. Raises PoolExhaustedError."""
        started = time.perf_counter()
        wait = self.config.acquire_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                while not self._ready:
                    if self._closed:
                        raise PoolClosedError("the sandbox pool is closed")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise PoolExhaustedError(
                            f"no sandbox free within {wait:g} s ({self._describe()}); "
                            "raise sandbox.pool_size or release sandboxes sooner"
                        )
                    self._cond.wait(remaining)
                sandbox = self._ready.popleft()
                if sandbox.intact():
                    break
                # It died (or its interpreter did) while idle: never lend it, its episode would
                # start with a failure that is not the caller's doing. Restart it, take another.
                self._note_failure(f"sandbox {sandbox.slot} died while idle in the pool; restarting it")
                self._tasks.put(("start", sandbox))
            self._busy.add(sandbox.slot)
        self._acquire_ms.append((time.perf_counter() - started) * 1000)
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """End the sandbox's episode; it is wiped and returned to the pool in the background."""
        with self._cond:
            if sandbox.slot not in self._busy:
                raise ValueError(f"{sandbox!r} is not checked out from this pool")
            self._busy.discard(sandbox.slot)
            self._episodes += 1
            self._cond.notify_all()
        if not sandbox.alive:
            self._note_failure(f"sandbox {sandbox.slot} died during an episode; restarting it")
        self._tasks.put(("reset" if sandbox.alive else "start", sandbox))

    # ------------------------------------------------------------ monitoring
    def status(self) -> PoolStatus:
        """Pool size, ready, busy, failures and latency percentiles, for the console."""
        calls = [r.duration_ms for r in list(self._calls)]
        acquires = list(self._acquire_ms)
        with self._cond:
            closed = self._closed
            ready, busy = len(self._ready), len(self._busy)
        # A closed pool has no sandbox ready, lent or starting: its size with all three at zero says so.
        return PoolStatus(
            backend=self.config.backend,
            size=len(self._slots),
            ready=0 if closed else ready,
            busy=0 if closed else busy,
            starting=0 if closed else len(self._slots) - ready - busy,
            failures=self._failures,
            infra_failures=self._infra,
            episodes=self._episodes,
            calls=self._ncalls,
            last_error=self._last_error,
            limits=self._limits,
            latency_ms={
                "call_p50": percentile(calls, 0.5),
                "call_p99": percentile(calls, 0.99),
                "acquire_p50": percentile(acquires, 0.5),
                "acquire_p99": percentile(acquires, 0.99),
            },
        )

    def recent_calls(self, limit: int | None = None) -> list[CallRecord]:
        """The most recent tool calls (bounded by ``latency_history``), oldest first."""
        records = list(self._calls)
        return records if limit is None else records[-limit:]

    def recent_acquire_ms(self) -> list[float]:
        return list(self._acquire_ms)

    def host_pids(self) -> list[int]:
        """Host pids of the launched sandbox processes (for leak checks and monitoring)."""
        return [pid for sandbox in self._slots if (pid := sandbox.pid) is not None]

    @property
    def directory(self) -> Path:
        return self._dir

    # -------------------------------------------------------------- internal
    def _record_call(self, sandbox: Sandbox, result: ToolResult) -> None:
        self._ncalls += 1
        if result.status is CallStatus.INFRA:
            self._infra += 1
        self._calls.append(CallRecord(time.time(), sandbox.slot, result.tool, result.status, result.duration_ms))

    def _maintain(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None or self._closed:
                return
            action, sandbox = task
            if action == "reset" and sandbox.reset(wipe=True):
                self._put_ready(sandbox)
                continue
            if action == "reset":
                self._note_failure(f"sandbox {sandbox.slot} did not reset; restarting it")
            self._restart(sandbox)

    def _restart(self, sandbox: Sandbox) -> None:
        delay = self._restart_delay.get(sandbox.slot, 0.0)
        if delay:
            time.sleep(delay)
        try:
            sandbox.start()
        except (SandboxStartError, OSError) as exc:
            self._note_failure(str(exc))
            self._restart_delay[sandbox.slot] = min(max(delay * 2, 0.5), MAX_RESTART_DELAY_S)
            if not self._closed:
                self._tasks.put(("start", sandbox))
            return
        self._restart_delay.pop(sandbox.slot, None)
        self._put_ready(sandbox)

    def _put_ready(self, sandbox: Sandbox) -> None:
        with self._cond:
            if self._closed:
                return
            self._ready.append(sandbox)
            self._cond.notify_all()

    def _note_failure(self, message: str) -> None:
        self._failures += 1
        self._last_error = message

    def _describe(self) -> str:
        return f"{len(self._ready)} ready, {len(self._busy)} busy of {len(self._slots)}"

    def _make_dir(self) -> Path:
        base = Path(tempfile.gettempdir()) if self._root is None else self._root
        owner = run_as(self.config)
        if owner is not None:  # the sandbox runs as another uid: it must be able to reach its directory
            for parent in [p for p in [base, *base.parents] if p.exists()]:
                if not parent.stat().st_mode & stat.S_IXOTH:
                    raise SandboxUnavailableError(
                        f"the sandbox user (uid {owner[0]}) cannot enter {parent}: set sandbox.root_dir "
                        "(or the data directory) to a place whose parent directories are world-executable"
                    )
        prefix = POOL_PREFIXES[1] if self._root is None else POOL_PREFIXES[0]
        base.mkdir(parents=True, exist_ok=True)
        for stale in workdir.unmount_stale(POOL_PREFIXES):
            shutil.rmtree(stale, ignore_errors=True)
        self._sweep_stale(base, prefix)
        directory = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
        directory.chmod(0o755)
        return directory

    @staticmethod
    def _sweep_stale(base: Path, prefix: str) -> None:
        """Remove pool directories (``<prefix><pid>-...``) left behind by processes that no longer exist."""
        for entry in base.glob(f"{prefix}*-*"):
            pid = entry.name[len(prefix) :].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(entry, ignore_errors=True)
