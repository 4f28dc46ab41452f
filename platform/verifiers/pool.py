"""A pool of verifier worker processes with a wall-clock limit per check.

Each worker is a spawned process that runs one check at a time in its main thread
(so SIGALRM-based libraries such as math-verify keep working). A check that runs past
its limit gets its worker killed and replaced; a worker that dies mid-check is
replaced too. Both come back as infrastructure-error verdicts, never as a score of 0
and never as a stuck caller.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import posttrain.platform.verifiers.kinds  # noqa: F401  (warm the built-in kinds)
from posttrain.platform.supervise import clean_context, start_worker
from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import CheckFn

log = logging.getLogger(__name__)

_READY = "ready"
_STARTUP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PoolConfig:
    """``workers``: processes (default: CPU count, 1 to 4). ``memory_limit_bytes``: address-space
    limit of each worker (None: unlimited). ``thread_checks``: concurrent checks of
    ``isolation="thread"`` kinds."""

    workers: int | None = None
    memory_limit_bytes: int | None = 4 * 1024**3
    thread_checks: int = 16


def _describe_exception(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _worker_main(conn: Connection, memory_limit_bytes: int | None) -> None:
    """Body of a worker process: receive (check, spec, completion, task), send a Verdict."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if memory_limit_bytes is not None:
        try:
            import resource  # Unix only

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        except (ImportError, ValueError, OSError):  # pragma: no cover - platform without rlimits
            pass

    conn.send(_READY)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        except BaseException as exc:  # a payload that cannot be unpickled here
            conn.send(Verdict.infra(f"the worker could not load the check: {_describe_exception(exc)}"))
            continue
        if message is None:
            return
        check, spec, completion, task = message
        try:
            verdict = check(spec, completion, task)
            if not isinstance(verdict, Verdict):
                verdict = Verdict.infra(
                    f"check {getattr(check, '__name__', check)!r} returned {type(verdict).__name__}, not a Verdict"
                )
        except MemoryError:
            verdict = Verdict.infra("the check ran out of memory in its worker")
        except BaseException as exc:  # noqa: BLE001 - a failing check is reported, not propagated
            verdict = Verdict.infra(f"the check raised {_describe_exception(exc)}")
        try:
            conn.send(verdict)
        except BaseException as exc:  # noqa: BLE001
            conn.send(Verdict.infra(f"the verdict could not be sent back: {_describe_exception(exc)}"))


class WorkerLost(Exception):
    """The worker process died or its pipe broke."""


class _Worker:
    def __init__(self, context: Any, memory_limit_bytes: int | None) -> None:
        parent, child = context.Pipe(duplex=True)
        self.process = start_worker(context, _worker_main, (child, memory_limit_bytes), name="posttrain-verifier")
        child.close()
        self.conn: Connection = parent
        if not parent.poll(_STARTUP_TIMEOUT_S):
            self.kill()
            raise WorkerLost(f"a verifier worker did not start within {_STARTUP_TIMEOUT_S:.0f} s")
        try:
            greeting = parent.recv()
        except EOFError:
            self.kill()
            raise WorkerLost(f"a verifier worker exited while starting (exit code {self.process.exitcode})") from None
        if greeting != _READY:  # pragma: no cover - protocol guard
            self.kill()
            raise WorkerLost(f"unexpected greeting from a verifier worker: {greeting!r}")

    def call(self, payload: tuple[Any, ...], timeout_s: float) -> Verdict:
        """Send one check and wait for its verdict. Raises TimeoutError or WorkerLost."""
        try:
            self.conn.send(payload)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as exc:
            raise WorkerLost(f"could not send the check: {exc}") from None
        if not self.conn.poll(timeout_s):
            raise TimeoutError
        try:
            return self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self.process.join(timeout=2)
            raise WorkerLost(f"the worker process died (exit code {self.process.exitcode})") from None

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.process.join(timeout=2)
        except (BrokenPipeError, OSError):
            pass
        self.kill()


class ProcessPool:
    """Worker processes handed out one check at a time; thread-safe."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.size = config.workers or max(1, min(4, os.cpu_count() or 1))
        self._context = clean_context()  # the memory limit bounds the check, not preloaded libraries
        self._slots: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(self.size):
            self._slots.put(None)
        self._live: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._threads = ThreadPoolExecutor(
            max_workers=config.thread_checks, thread_name_prefix="posttrain-verify-thread"
        )

    def _start_worker(self) -> _Worker:
        worker = _Worker(self._context, self.config.memory_limit_bytes)
        with self._lock:
            self._live.add(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def run_in_process(self, check: CheckFn, spec: Any, completion: str, task: TaskSpec, timeout_s: float) -> Verdict:
        if self._closed:
            raise RuntimeError("the verifier pool is closed")
        worker = self._slots.get()
        try:
            for attempt in (1, 2):
                if worker is None:
                    worker = self._start_worker()
                try:
                    return worker.call((check, spec, completion, task), timeout_s)
                except TimeoutError:
                    self._retire(worker)
                    worker = None
                    return Verdict.infra(f"the check did not finish within {timeout_s:g} s; its worker was killed")
                except WorkerLost as lost:
                    self._retire(worker)
                    worker = None
                    if attempt == 2 or "could not send" not in str(lost):
                        return Verdict.infra(str(lost))
            raise AssertionError("unreachable")  # pragma: no cover
        except WorkerLost as lost:  # could not even start a worker
            return Verdict.infra(str(lost))
        finally:
            self._slots.put(worker)

    def run_in_thread(self, check: CheckFn, spec: Any, completion: str, task: TaskSpec, timeout_s: float) -> Verdict:
        if self._closed:
            raise RuntimeError("the verifier pool is closed")
        future = self._threads.submit(check, spec, completion, task)
        try:
            verdict = future.result(timeout=timeout_s)
        except FutureTimeout:
            return Verdict.infra(
                f"the check did not finish within {timeout_s:g} s (it runs in a thread and is left to end itself)"
            )
        except Exception as exc:  # noqa: BLE001
            return Verdict.infra(f"the check raised {_describe_exception(exc)}")
        if not isinstance(verdict, Verdict):
            return Verdict.infra(f"check returned {type(verdict).__name__}, not a Verdict")
        return verdict

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = list(self._live)
            self._live.clear()
        for worker in workers:
            worker.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for monitoring and tests)."""
        with self._lock:
            return [w.process.pid for w in self._live if w.process.pid is not None]
